"""A shared worker's capacity registration, written by hand: benches that drive the dispatcher
without real workers give it the free slots a worker's heartbeat would (``workers.roles``)."""

from __future__ import annotations

import redis

from celery_app.redis.schema import Keys, WorkerField, WorkerRoleName


def register_capacity(
    state: redis.Redis, keys: Keys, hostname: str, region: str, concurrency: int
) -> None:
    """``hostname`` counts as a shared worker of ``region`` with ``concurrency`` slots."""
    state.hset(
        keys.worker(hostname),
        mapping={
            WorkerField.REGION: region,
            WorkerField.ROLE: WorkerRoleName.SHARED,
            WorkerField.QUEUES: "",
            WorkerField.CONCURRENCY: concurrency,
        },
    )
    state.sadd(keys.region_workers(region), hostname)
