"""Free probe slots per region, from the workers' heartbeats and the leases in flight.

A slot whose probe thread still runs past its deadline is reported by its worker
(``WorkerField.STUCK``) and never counted free, until the thread returns.

The workers write ``Keys.worker(hostname)`` (fields :class:`~celery_app.redis.schema.WorkerField`;
TTL ~15 s, refreshed ~5 s) and index it in ``Keys.region_workers(region)``. The
claim script (``lua/claim.lua``) applies the same rule atomically; this module is the pure rule
and the read the CLI's diagnose uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis

from celery_app.findings import Finding, FindingKind
from celery_app.redis.schema import Keys, WorkerField, WorkerRoleName
from scheduling_core import LANE_FAST, LANE_SLOW


@dataclass(frozen=True)
class RegionCapacity:
    region: str
    total: int
    slow_capacity: int
    in_flight_fast: int
    in_flight_slow: int
    workers: tuple[str, ...]

    @property
    def free(self) -> int:
        """Slots a fast job may take (any slot of the region)."""
        return max(0, self.total - self.in_flight_fast - self.in_flight_slow)

    @property
    def free_slow(self) -> int:
        """Slots a slow job may take: never the fast-only workers' reserved slots."""
        return max(0, min(self.slow_capacity - self.in_flight_slow, self.free))


def usable_slots(concurrency: str, stuck: str | None) -> int:
    """A worker's slots that may take work: its concurrency minus the slots whose probe thread
    runs on past its deadline (``WorkerField.STUCK``), as ``claim.lua`` counts them."""
    return max(0, int(concurrency) - int(stuck or 0))


def read_capacity(client: redis.Redis, keys: Keys, region: str) -> RegionCapacity:
    members = client.smembers(keys.region_workers(region))
    hosts = sorted(cast("set[str]", members))  # decode_responses=True
    pipe = client.pipeline(transaction=False)
    for host in hosts:
        pipe.hmget(keys.worker(host), WorkerField.ROLE, WorkerField.CONCURRENCY, WorkerField.STUCK)
    pipe.zcard(keys.leases(region, LANE_FAST))
    pipe.zcard(keys.leases(region, LANE_SLOW))
    *entries, in_fast, in_slow = pipe.execute()
    total = slow = 0
    live = []
    for host, (role, concurrency, stuck) in zip(hosts, entries, strict=True):
        if concurrency is None:
            continue
        live.append(host)
        slots = usable_slots(concurrency, stuck)
        total += slots
        if role == WorkerRoleName.SHARED:
            slow += slots
    return RegionCapacity(region, total, slow, in_fast, in_slow, tuple(live))


def diagnose_regions(client: redis.Redis, keys: Keys, regions: list[str]) -> list[Finding]:
    """Problems an operator must know: regions with due checks and no live worker."""
    problems = []
    for region in regions:
        cap = read_capacity(client, keys, region)
        waiting = client.zcard(keys.ready(region, LANE_FAST)) + client.zcard(
            keys.ready(region, LANE_SLOW)
        )
        if not cap.workers:
            message = (
                f"region {region}: no live worker registered; {waiting} due job(s) wait and "
                "nothing is claimed there until a worker for this region starts"
            )
            problems.append(Finding(FindingKind.NO_LIVE_WORKER, region, message))
        elif cap.slow_capacity == 0 and client.zcard(keys.ready(region, LANE_SLOW)):
            message = (
                f"region {region}: slow-lane jobs wait but no shared worker consumes "
                f"checks.{region}.slow"
            )
            problems.append(Finding(FindingKind.NO_SHARED_WORKER, region, message))
    return problems
