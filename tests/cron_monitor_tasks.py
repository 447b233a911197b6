"""What the cron monitor test's workers load (CHECKBEAT_IMPORTS): a plain Celery task that
fails while ``cronmon:fail`` exists in the state Redis, and a per-tenant one that takes as long
as ``cronmon:slow:<tenant>`` says."""

from __future__ import annotations

import os
import time

import redis
from celery import shared_task

FAIL = "cronmon:fail"


@shared_task(name="cronmon.job")
def job() -> str:
    client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
    if client.exists(FAIL):
        raise RuntimeError("the job failed on purpose")
    return "ok"


SLOW = "cronmon:slow:"  # + tenant: seconds the tenant's run takes


@shared_task(name="cronmon.tenant_job")
def tenant_job(tenant: str) -> str:
    """A per-tenant job: its run takes the seconds ``cronmon:slow:<tenant>`` says (its work)."""
    client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
    seconds = client.get(SLOW + tenant)
    if seconds:
        time.sleep(float(seconds))
    return tenant
