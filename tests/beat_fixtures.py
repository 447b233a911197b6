"""Fixtures and helpers of the cron/beat tests: a fresh app per test, engines, broker reads."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

import pytest
import redis
from celery import Celery

from beat.cron_engine import CronEngine
from celery_app.cron_tasks.publish import CronPublisher
from celery_app.cron_tasks.registration import cron_tasks
from celery_app.cron_tasks.store import CronStore
from celery_app.cron_tasks.tenants import resolve_tenants
from celery_app.factory import create_app, settings_of
from celery_app.redis.client import get_redis
from celery_app.redis.schema import Keys
from celery_app.settings import load_settings

#: A fixed minute in the future: windows are simulated, message expiries stay in the future.
T0 = datetime(2030, 1, 1, 0, 0, tzinfo=UTC)


@pytest.fixture(name="cron_app")
def cron_app_fixture(r: redis.Redis, broker_url: str) -> Iterator[Celery]:
    """A fresh app (its own task registry) on empty state and broker dbs."""
    redis.Redis.from_url(broker_url).flushdb()
    app = create_app(load_settings())
    yield app
    app.close()


def store_of(app: Celery) -> CronStore:
    settings = settings_of(app)
    return CronStore(get_redis(settings.redis_url), Keys(settings.key_prefix), settings.cron_grace)


def make_engine(app: Celery, *, start: datetime = T0, owner: str = "engine-1") -> CronEngine:
    settings = settings_of(app)
    tasks = list(cron_tasks(app).values())
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


def end_runs(r: redis.Redis) -> None:
    """Stand in for workers finishing every run: release all in-flight keys."""
    for key in r.scan_iter(Keys("cbtest").cron_inflight("*", "*")):
        r.delete(key)
