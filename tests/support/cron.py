"""Helpers of the cron/beat tests: the simulated start instant, engines, broker reads."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import redis
from celery import Celery

from beat.cron_engine import CronEngine
from celery_app.cron_tasks.cron_state import CronStore
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.cron_tasks.tenants_provider import resolve_tenants
from celery_app.factory import settings_of
from celery_app.findings import Finding
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys


def day_after_tomorrow(now: datetime) -> datetime:
    """00:00 UTC of the day after ``now``'s next day: between 24 and 48 hours ahead of ``now``."""
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + timedelta(days=2)


#: Where the tests' simulated cron windows start: 00:00 UTC the day after tomorrow, read from the
#: real clock once per process. Cron messages carry an absolute ``expires`` (the window's end plus
#: the grace) that a real worker compares with the real clock, so simulated windows must stay ahead
#: of it for a whole run (here: at least 24 h); midnight keeps the minute, hour and day alignment
#: the specs rely on, as the old pinned 2030-01-01 did, without a date that one day stops being in
#: the future. A subprocess is handed this value (``T0.isoformat()``), never computes its own.
T0 = day_after_tomorrow(datetime.now(UTC))


def store_of(app: Celery) -> CronStore:
    settings = settings_of(app)
    return CronStore(
        get_redis(settings.redis_url, settings), state_keys(settings), settings.cron_grace
    )


#: When :func:`make_engine`'s tasks were first seen by default: a day before ``T0``, so its
#: engines run a deployment in its steady state (every task has its reference instant; an
#: interval's windows are counted from a midnight, as from the epoch for any that divides a day).
SEEN = T0 - timedelta(days=1)


def seen_since(app: Celery, when: datetime) -> None:
    """Record every task of ``app`` as first seen at ``when`` (``Keys.cron_ref``), as a beat that
    ran then would have; a reference already there is kept."""
    store_of(app).note_refs(list(all_tasks(app).values()), when)


def make_engine(
    app: Celery, *, start: datetime = T0, owner: str = "engine-1", seen: datetime | None = SEEN
) -> CronEngine:
    """An engine whose clock stands at ``start``; its tasks were first seen at ``seen`` (None:
    never, a first deployment)."""
    settings = settings_of(app)
    tasks = list(all_tasks(app).values())
    if seen is not None:
        seen_since(app, seen)
    publisher = CronPublisher(app, settings.cron_grace)
    publisher.prepare(tasks)
    return CronEngine(
        tasks,
        store_of(app),
        publisher,
        resolve_tenants(app),
        grace=settings.cron_grace,
        owner=owner,
        start=start,
        clock=lambda: start,
    )


def broker_headers(broker_url: str, queues: Iterable[str] = ("celery",)) -> list[dict]:
    """The Celery headers of every message waiting in ``queues``."""
    client = redis.Redis.from_url(broker_url)
    out = []
    for queue in queues:
        for raw in client.lrange(queue, 0, -1):
            out.append(json.loads(raw)["headers"])
    return out


def sends(broker_url: str, queues: Iterable[str] = ("celery",)) -> Counter:
    """(cron task id, tenant, window) -> number of messages in the broker."""
    return Counter(
        (h["cron_task"], h["cron_tenant"], h["cron_window"])
        for h in broker_headers(broker_url, queues)
    )


def recording_worker(r: redis.Redis, name: str = "celery@recording") -> None:
    """Stand in for a live worker that records runs (its marker, as the recording's
    ``worker_init`` writes it), for tests that write the run records themselves."""
    r.hset(Keys("cbtest").cron_recorders(), name, time.time())


def end_runs(r: redis.Redis) -> None:
    """Stand in for workers finishing every run: release all in-flight keys."""
    for key in r.scan_iter(Keys("cbtest").cron_inflight("*", "*")):
        r.delete(key)


def found(findings: Iterable[Finding]) -> set[tuple[str, str, datetime | None]]:
    """What diagnose found, as (kind, subject, since): what a test decides on, not the wording."""
    return {(f.kind, f.subject, f.since) for f in findings}
