"""What a run read when it started, and its outcome, kept for its post-exec write in the same
thread.

Why: the task reads the job and Redis's time in one round trip just before its probe (with the
maintenance version its process last saw, ``maintenance.WINDOWS.known_version``); the
post-exec write (``task_postrun``, sent in the thread that ran the task, in every pool) plans
from that read and checks it atomically instead of reading it all again
(:mod:`celery_app.checks.completion`). The outcome is handed over the same way, so the task's
return value is only a short summary for the log line and Flower (Celery ``saferepr``s it into
both on every run). Kept per thread, matched by task id: a run that failed before its outcome
leaves nothing another run could take. The moment the probe starts is kept too
(:func:`probing`): a run that raises before it gives its lease back, one that raises after it is
recorded (``workers.post_exec``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from celery_app.checks.jobs import JobState, ReadGuard
from workers.outcome import RunOutcome


@dataclass(frozen=True)
class RunStart:
    """One run's start read: the job as read, its guard, and Redis's time at the read."""

    task_id: str
    job: JobState
    guard: ReadGuard
    server_now: float  # Redis time (Unix s) when the read was answered
    read_at: float  # time.perf_counter() then

    def now(self) -> float:
        """Redis's time now: the read's, advanced by this process's monotonic clock (which a
        skewed wall clock does not move)."""
        return self.server_now + (time.perf_counter() - self.read_at)


@dataclass(frozen=True)
class ProbeStart:
    """The moment a run's probe starts: from then on a failure of the run still records it
    (``workers.post_exec``), as a result naming the exception, scrubbed of ``secrets``."""

    task_id: str
    started_at: float  # time.time() then
    at: float  # time.perf_counter() then
    secrets: tuple[str, ...]

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.at) * 1000.0


_local = threading.local()


def keep(start: RunStart) -> None:
    """The run's start read, once the run is known to be current."""
    _local.start, _local.outcome = start, None


def probing(task_id: str, secrets: tuple[str, ...]) -> ProbeStart:
    """The run's probe starts now (after its start read and its wait for the tick)."""
    started = _local.probing = ProbeStart(task_id, time.time(), time.perf_counter(), secrets)
    return started


def probe_started(task_id: str | None) -> ProbeStart | None:
    """Whether (and when) the probe of ``task_id`` started in this thread; :func:`take` forgets
    it."""
    started: ProbeStart | None = getattr(_local, "probing", None)
    return started if started is not None and started.task_id == task_id else None


def finish(task_id: str, outcome: RunOutcome) -> None:
    """The run's outcome, for the post-exec write."""
    _local.outcome = (task_id, outcome)


def take(task_id: str | None) -> tuple[RunStart | None, RunOutcome | None]:
    """(start read, outcome) of ``task_id``, each None if this thread kept none for it; both
    forgotten either way."""
    start: RunStart | None = getattr(_local, "start", None)
    finished: tuple[str, RunOutcome] | None = getattr(_local, "outcome", None)
    _local.start = _local.outcome = _local.probing = None
    outcome = finished[1] if finished is not None and finished[0] == task_id else None
    return (start if start is not None and start.task_id == task_id else None), outcome
