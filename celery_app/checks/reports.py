"""Read-only reports over the jobs: the cost distribution per lane and delay percentiles.

Pure summaries (``summarize``) over values read in one pipelined pass (``read_all_jobs``).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from celery_app.checks.jobs import JobState, UnreadableJob, read_jobs_for_report
from celery_app.checks.store import listed_uids
from celery_app.redis.schema import LANE_NAMES, CheckField, Keys, job_id

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


def bucket_labels() -> list[str]:
    """``< 100 ms``, ``100-500 ms``, ... ``>= 15000 ms``: the cost histogram's buckets."""
    edges = COST_BUCKETS_MS
    labels = [f"< {edges[0]:g} ms"]
    labels += [f"{lo:g}-{hi:g} ms" for lo, hi in itertools.pairwise(edges)]
    labels.append(f">= {edges[-1]:g} ms")
    return labels


def summarize(jobs: Sequence[JobState]) -> list[LaneReport]:
    """Per lane: cost and delay EWMA percentiles and the cost histogram."""
    labels = bucket_labels()
    reports = []
    for lane, name in enumerate(LANE_NAMES):
        mine = [j for j in jobs if j.lane == lane]
        buckets = dict.fromkeys(labels, 0)
        for j in mine:
            buckets[labels[bisect.bisect_right(COST_BUCKETS_MS, j.cost_ewma_ms)]] += 1
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
) -> list[JobState | UnreadableJob]:
    """Every job (of one tenant), read in pipelined batches; a torn one is an UnreadableJob."""
    uids = listed_uids(client, keys, tenant)
    jobs: list[JobState | UnreadableJob] = []
    for start in range(0, len(uids), batch):
        chunk = uids[start : start + batch]
        pipe = client.pipeline(transaction=False)
        for uid in chunk:
            pipe.hget(keys.check(uid), CheckField.REGIONS)
        ids = [
            job_id(uid, region)
            for uid, regions in zip(chunk, pipe.execute(), strict=True)
            if regions
            for region in regions.split(",")
        ]
        jobs.extend(j for j in read_jobs_for_report(client, keys, ids) if j is not None)
    return jobs
