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


_WORKER_FIELDS = (WorkerField.ROLE, WorkerField.CONCURRENCY, WorkerField.STUCK)


def read_capacity(
    client: redis.Redis, keys: Keys, region: str, *, every_partition: bool = True
) -> RegionCapacity:
    """The region's slots and leases, summed over the partitions of the check half (each
    holds its share of every worker's slots, ``workers.roles``); ``every_partition`` False:
    those of ``keys``' partition only."""
    parts = keys.every_partition() if every_partition else [keys]
    pipe = client.pipeline(transaction=False)
    for part in parts:
        pipe.smembers(part.region_workers(region))
    members = pipe.execute()
    total = slow = in_fast = in_slow = 0
    live: set[str] = set()
    for part, hosts in zip(parts, members, strict=True):
        hosts = sorted(hosts)  # decode_responses=True
        pipe = client.pipeline(transaction=False)
        for host in hosts:
            pipe.hmget(
                part.worker(host), WorkerField.ROLE, WorkerField.CONCURRENCY, WorkerField.STUCK
            )
        pipe.zcard(part.leases(region, LANE_FAST))
        pipe.zcard(part.leases(region, LANE_SLOW))
        *entries, fast, slow_leases = pipe.execute()
        in_fast, in_slow = in_fast + fast, in_slow + slow_leases
        for host, (role, concurrency, stuck) in zip(hosts, entries, strict=True):
            if concurrency is None:
                continue
            live.add(host)
            slots = usable_slots(concurrency, stuck)
            total += slots
            if role == WorkerRoleName.SHARED:
                slow += slots
    return RegionCapacity(region, total, slow, in_fast, in_slow, tuple(sorted(live)))


def _partitions_without_slots(client: redis.Redis, keys: Keys, region: str) -> list[int]:
    """The partitions whose share of the region's live worker slots is nothing (a worker has
    fewer slots than there are partitions: ``scheduling_core.partitions.slot_shares``)."""
    if keys.partitions == 1:
        return []
    return [
        part.partition
        for part in keys.every_partition()
        if read_capacity(client, part, region, every_partition=False).total == 0
    ]


def _ready(client: redis.Redis, keys: Keys, region: str, lanes: tuple[int, ...]) -> int:
    """Jobs waiting in the ready indexes of ``lanes`` of ``region``, in every partition."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        for lane in lanes:
            pipe.zcard(part.ready(region, lane))
    return sum(pipe.execute())


def diagnose_regions(client: redis.Redis, keys: Keys, regions: list[str]) -> list[Finding]:
    """Problems an operator must know: regions with due checks and no live worker."""
    problems = []
    for region in regions:
        cap = read_capacity(client, keys, region)
        waiting = _ready(client, keys, region, (LANE_FAST, LANE_SLOW))
        if not cap.workers:
            message = (
                f"region {region}: no live worker registered; {waiting} due job(s) wait and "
                "nothing is claimed there until a worker for this region starts"
            )
            problems.append(Finding(FindingKind.NO_LIVE_WORKER, region, message))
        elif starved := _partitions_without_slots(client, keys, region):
            message = (
                f"region {region}: partition(s) {', '.join(map(str, starved))} of "
                f"{keys.partitions} have no worker slot, so their checks do not run there: give "
                f"each worker at least CHECKBEAT_CHECK_PARTITIONS ({keys.partitions}) slots"
            )
            problems.append(Finding(FindingKind.PARTITION_WITHOUT_SLOTS, region, message))
        elif cap.slow_capacity == 0 and _ready(client, keys, region, (LANE_SLOW,)):
            message = (
                f"region {region}: slow-lane jobs wait but no shared worker consumes "
                f"checks.{region}.slow"
            )
            problems.append(Finding(FindingKind.NO_SHARED_WORKER, region, message))
    return problems
