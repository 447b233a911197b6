"""A user's Celery project that sets only ``beat_scheduler``: no ``install`` call."""
