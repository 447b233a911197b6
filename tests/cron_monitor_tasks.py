"""What the cron monitor test's workers load (CHECKBEAT_IMPORTS): a plain Celery task that
fails while ``cronmon:fail`` exists in the state Redis."""

from __future__ import annotations

import os

import redis
from celery import shared_task

FAIL = "cronmon:fail"


@shared_task(name="cronmon.job")
def job() -> str:
    client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
    if client.exists(FAIL):
        raise RuntimeError("the job failed on purpose")
    return "ok"
