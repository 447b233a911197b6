"""Read-only reports over the jobs: the cost distribution per lane and delay percentiles.

Pure summaries (``summarize``) over values read in one pipelined pass (``read_all_jobs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from celery_app.jobs import JobState, read_jobs
from celery_app.keys import LANE_NAMES, Keys, job_id

COST_BUCKETS_MS = (100.0, 500.0, 1000.0, 5000.0, 15000.0)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class Distribution:
    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        ordered = sorted(values)
        return cls(
            len(ordered),
            percentile(ordered, 50),
            percentile(ordered, 90),
            percentile(ordered, 99),
            ordered[-1] if ordered else 0.0,
        )


@dataclass(frozen=True)
class LaneReport:
    lane: str
    cost: Distribution
    delay: Distribution
    buckets: dict[str, int]


def bucket_label(upper: float | None, lower: float) -> str:
    return f">= {lower:g} ms" if upper is None else f"< {upper:g} ms"


def summarize(jobs: Sequence[JobState]) -> list[LaneReport]:
    reports = []
    for lane, name in enumerate(LANE_NAMES):
        mine = [j for j in jobs if j.lane == lane]
        buckets: dict[str, int] = {bucket_label(b, 0): 0 for b in COST_BUCKETS_MS}
        buckets[bucket_label(None, COST_BUCKETS_MS[-1])] = 0
        for j in mine:
            for upper in COST_BUCKETS_MS:
                if j.cost_ewma_ms < upper:
                    buckets[bucket_label(upper, 0)] += 1
                    break
            else:
                buckets[bucket_label(None, COST_BUCKETS_MS[-1])] += 1
        reports.append(
            LaneReport(
                name,
                Distribution.of([j.cost_ewma_ms for j in mine]),
                Distribution.of([j.delay_ewma_ms for j in mine]),
                buckets,
            )
        )
    return reports


def read_all_jobs(
    client: redis.Redis, keys: Keys, tenant: str | None = None, batch: int = 5000
) -> list[JobState]:
    """Every job (of one tenant), read in pipelined batches."""
    uids = sorted(client.smembers(keys.tenant_checks(tenant) if tenant else keys.checks()))
    jobs: list[JobState] = []
    for start in range(0, len(uids), batch):
        chunk = uids[start : start + batch]
        pipe = client.pipeline(transaction=False)
        for uid in chunk:
            pipe.hget(keys.check(uid), "g")
        ids = [
            job_id(uid, region)
            for uid, regions in zip(chunk, pipe.execute(), strict=True)
            if regions
            for region in regions.split(",")
        ]
        jobs.extend(j for j in read_jobs(client, keys, ids) if j is not None)
    return jobs
