"""What ``run_check`` read before probing (the job, Redis's time, the maintenance version),
handed to the post-exec write of the same run so it does not read them again: one round trip
per run fewer (the write's lease check in ``complete.lua`` still guards the job).

Keyed by (job id, lease token); the post-exec handler of the same process takes it. A run whose
post-exec never comes in this process (a killed pool process) leaves an entry; the map is
bounded and drops its oldest entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from celery_app.checks.jobs import JobState

#: Entries kept at most (a run in flight per slot; more are runs whose post-exec never came).
MAX_PENDING = 4096

_pending: dict[tuple[str, str], RunRead] = {}


@dataclass(frozen=True)
class RunRead:
    """The run's reads: the job under this lease, Redis's time at ``read_at`` (this process's
    ``perf_counter``), and the maintenance version read with them."""

    job: JobState
    server_now_s: float
    read_at: float
    maintenance_version: str | None

    def server_now(self) -> float:
        """Redis's time now: the time read, plus the monotonic time since."""
        return self.server_now_s + max(0.0, time.perf_counter() - self.read_at)


def hand_over(read: RunRead) -> None:
    """Keep the run's reads for its post-exec write."""
    if len(_pending) >= MAX_PENDING:
        for key in list(_pending)[: MAX_PENDING // 2]:
            _pending.pop(key, None)
    _pending[(read.job.job_id, read.job.lease_token or "")] = read


def take(job_id: str, lease_token: str) -> RunRead | None:
    """The reads of this run, once (None: not read in this process, e.g. a killed run)."""
    return _pending.pop((job_id, lease_token), None)
