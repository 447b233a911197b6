"""A check worker's capacity registration without the worker: benches that drive the dispatcher
without real workers (and the dispatcher tests, through ``tests/support/checks.py``) write the
hash and region membership a worker's heartbeat writes (``workers.roles``), from its own
:meth:`~workers.roles.WorkerRole.fields`, so the shape is defined once."""

from __future__ import annotations

import redis

from celery_app.redis.schema import Keys, WorkerRoleName, check_queue
from workers.roles import WorkerRole


def register_capacity(
    state: redis.Redis,
    keys: Keys,
    hostname: str,
    region: str,
    concurrency: int,
    *,
    role: str = WorkerRoleName.SHARED,
    ttl_s: int | None = None,
) -> None:
    """``hostname`` counts as a ``role`` worker of ``region`` with ``concurrency`` slots (the
    fast role consumes the fast queue only, the shared one both); ``ttl_s``: expires like a
    heartbeat that stopped, None: kept."""
    lanes = ("fast",) if role == WorkerRoleName.FAST else ("fast", "slow")
    worker = WorkerRole(
        role, region, tuple(check_queue(region, lane) for lane in lanes), concurrency
    )
    pipe = state.pipeline()
    pipe.hset(keys.worker(hostname), mapping=worker.fields(hostname))
    if ttl_s:
        pipe.expire(keys.worker(hostname), ttl_s)
    pipe.sadd(keys.region_workers(region), hostname)
    pipe.execute()
