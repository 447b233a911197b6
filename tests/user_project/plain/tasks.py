"""A cron task firing every minute."""

from celery_app import cron
from plain.celery import app


@cron("* * * * *", id="plain-minute", app=app)
def every_minute() -> str:
    return "ran"
