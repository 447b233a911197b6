"""Click commands that plug into ``celery`` (entry point group ``celery.commands``)."""
