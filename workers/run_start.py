"""What a run read when it started, kept for its post-exec write in the same thread.

Why: the task reads the job, the maintenance version and Redis's time in one round trip just
before its probe; the post-exec write (``task_postrun``, sent in the thread that ran the task,
in every pool) plans from that read and checks it atomically instead of reading it all again
(:mod:`celery_app.checks.planned_write`). Kept per thread, matched by task id: a run that
failed before its outcome leaves nothing another run could take.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from celery_app.checks.jobs import JobState, ReadGuard


@dataclass(frozen=True)
class RunStart:
    """One run's start read: the job as read, its guard, and Redis's time at the read."""

    task_id: str
    job: JobState
    guard: ReadGuard
    maintenance_version: str | None
    server_now: float  # Redis time (Unix s) when the read was answered
    read_at: float  # time.perf_counter() then

    def now(self) -> float:
        """Redis's time now: the read's, advanced by this process's monotonic clock (which a
        skewed wall clock does not move)."""
        return self.server_now + (time.perf_counter() - self.read_at)


_local = threading.local()


def keep(start: RunStart) -> None:
    _local.start = start


def take(task_id: str | None) -> RunStart | None:
    """The start read of ``task_id`` if this thread kept one (forgotten either way)."""
    start: RunStart | None = getattr(_local, "start", None)
    _local.start = None
    return start if start is not None and start.task_id == task_id else None
