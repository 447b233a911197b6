"""Fixtures and test data for the check store, jobs and dispatcher tests.

``register_fake_worker`` writes the capacity entry a real worker's heartbeat writes (the
workers' contract), for dispatcher tests that do not need probes to run: test data, not a mock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from celery_app.checks import CheckStore
from celery_app.keys import Keys, check_queue
from celery_app.kinds import CheckFieldError, check_kind, unregister_kind
from celery_app.settings import Settings, load_settings

TEST_KIND = "testprobe"
REGIONS = ["eu", "us", "ap"]


def _validate(target: str, config: dict) -> dict:
    if "timeout" in config and not (
        isinstance(config["timeout"], int | float) and config["timeout"] > 0
    ):
        raise CheckFieldError("config.timeout", f"must be a number > 0, got {config['timeout']!r}")
    return {"timeout": 5, **config}


def _probe(target: str, config: dict) -> dict:
    return {"ok": True, "target": target}


@pytest.fixture
def test_kind() -> Iterator[str]:
    check_kind(TEST_KIND, validate=_validate)(_probe)
    yield TEST_KIND
    unregister_kind(TEST_KIND)


@pytest.fixture
def settings(redis_url: str, broker_url: str) -> Settings:
    return load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=REGIONS
    )


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.key_prefix)


@pytest.fixture
def store(r: redis.Redis, keys: Keys, settings: Settings, test_kind: str) -> CheckStore:
    return CheckStore(r, keys, settings)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def register_fake_worker(
    client: redis.Redis,
    keys: Keys,
    hostname: str,
    *,
    region: str,
    role: str,
    concurrency: int,
    ttl: int | None = 60,
) -> None:
    """Write the capacity heartbeat of a worker: role "fast" consumes the fast queue only,
    "shared" the fast and the slow queue."""
    lanes = ["fast"] if role == "fast" else ["fast", "slow"]
    queues = ",".join(check_queue(region, lane) for lane in lanes)
    pipe = client.pipeline()
    pipe.hset(
        keys.worker(hostname),
        mapping={"region": region, "role": role, "queues": queues, "concurrency": concurrency},
    )
    if ttl:
        pipe.expire(keys.worker(hostname), ttl)
    pipe.sadd(keys.region_workers(region), hostname)
    pipe.execute()


def learned(
    client: redis.Redis,
    keys: Keys,
    params,
    job_id: str,
    *,
    scheduled_at: float,
    cost_ms: float = 0.0,
    lane: int = 0,
    plan_weight: int = 0,
) -> None:
    """Put a job at ``scheduled_at`` with a learned cost and lane, through the real write path
    (a lease, then ``complete_run``), as if its previous run had just finished."""
    from celery_app.jobs import complete_run
    from scheduling_core import PostExecState

    client.hset(keys.job(job_id), "lt", "setup")
    client.zrem(keys.due(), job_id)
    ea = params.effective_scheduled_at(at(scheduled_at), cost_ms, plan_weight)
    state = PostExecState(
        cost_ewma_ms=cost_ms, delay_ewma_ms=0.0, effective_scheduled_at=ea, lane=lane
    )
    assert complete_run(client, keys, job_id, "setup", state, at(scheduled_at))


@pytest.fixture
def dispatcher_app(settings: Settings):
    """A Celery app built from the test settings (broker db 0, state db 1)."""
    from celery_app.app import create_app

    return create_app(settings)


@pytest.fixture
def broker(broker_url: str) -> Iterator[redis.Redis]:
    """The broker db, emptied before the test (queued messages are test state too)."""
    client = redis.Redis.from_url(broker_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()
