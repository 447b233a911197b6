"""Test data helpers for the check store, jobs and dispatcher tests (their fixtures are in
``checks_fixtures``).

``register_fake_worker`` writes the capacity entry a real worker's heartbeat writes (the
workers' contract), for dispatcher tests that do not need probes to run: test data, not a mock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import redis

from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.redis.schema import JobField, Keys
from support.capacity import register_capacity

#: The keys of every results-history record, whichever path wrote it (worker, kill, reaper).
RECORD_KEYS = frozenset(RunRecord(RunStatus.UP, "-", finished_at=0.0).as_dict())


def at(seconds: float) -> datetime:
    """The UTC instant ``seconds`` after the epoch."""
    return datetime.fromtimestamp(seconds, UTC)


def results(r: redis.Redis, keys: Keys, uid: str, region: str | None = None) -> list[dict]:
    """The run records of check ``uid``'s results history, oldest first (only ``region``'s, if
    given)."""
    rows = [json.loads(fields["result"]) for _id, fields in r.xrange(keys.results(uid))]
    return [row for row in rows if region is None or row["region"] == region]


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
    "shared" the fast and the slow queue (:func:`support.capacity.register_capacity`)."""
    register_capacity(client, keys, hostname, region, concurrency, role=role, ttl_s=ttl)


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
    (a lease, then complete.lua), as if its previous run had just finished."""
    from celery_app.checks.jobs import CompletedRun
    from scheduling_core import PostExecState
    from support.completion import write

    client.hset(keys.job(job_id), JobField.LEASE_TOKEN, "setup")
    client.zrem(keys.of_job(job_id).due(), job_id)
    ea = params.effective_scheduled_at(at(scheduled_at), cost_ms, plan_weight)
    state = PostExecState(
        cost_ewma_ms=cost_ms, delay_ewma_ms=0.0, effective_scheduled_at=ea, lane=lane
    )
    assert write(client, keys, [CompletedRun(job_id, "setup", state, at(scheduled_at))]) == [True]
