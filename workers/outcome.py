"""The outcome of one run as a value: what the run task hands to the post-exec handler.

Why values: the run task and the post-exec signal handler are two functions that Celery calls at
different moments (and, for a hard time limit, in different processes); the outcome is what
passes between them, and it must survive JSON (it travels as the task's return value).

Why it stays here and not in the run contract: it is the worker's private hand-off (it carries
the lease token and the probe's duration to the one write); what leaves the worker is the
contract's :class:`~celery_app.checks.run_contract.RunRecord`, built by :meth:`record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_app.checks.redaction import scrub, scrub_value
from celery_app.checks.run_contract import RunRecord, RunRequest, RunStatus
from celery_app.redis.schema import split_job_id
from workers.probes.result import ProbeResult


@dataclass(frozen=True)
class RunOutcome:
    """One finished run: what the post-exec handler folds and the results history keeps."""

    job_id: str
    lease_token: str
    scheduled_at: float
    status: RunStatus
    latency_ms: float
    duration_ms: float
    timed_out: bool
    error_class: str | None
    error: str | None
    started_at: float | None
    finished_at: float
    worker: str
    timeout_s: float = 0.0
    queue: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)
    degraded: str | None = None

    @classmethod
    def of_probe(
        cls,
        request: RunRequest,
        result: ProbeResult,
        *,
        duration_ms: float,
        started_at: float,
        finished_at: float,
        worker: str,
        queue: str = "",
        secrets: tuple[str, ...],
    ) -> RunOutcome:
        """The outcome of a probe's ``result``: the one place a run's result is built, so the
        one place its texts are scrubbed of the check's ``secrets``
        (:func:`celery_app.checks.redaction.check_secrets`): a probe, or a library it calls,
        may quote a header value or a password in an error, and what is built here goes to the
        results stream, the last result, transitions and hooks."""
        return cls(
            job_id=request.job_id,
            lease_token=request.lease_token,
            scheduled_at=request.scheduled_at,
            status=RunStatus(result.status),
            latency_ms=round(result.latency_ms, 3),
            duration_ms=round(duration_ms, 3),
            timed_out=result.timed_out,
            error_class=result.error_class,
            error=scrub(result.error, secrets) if result.error else result.error,
            started_at=started_at,
            finished_at=finished_at,
            worker=worker,
            timeout_s=request.timeout_s,
            queue=queue,
            detail=scrub_value(dict(result.detail), secrets),
            degraded=scrub(result.degraded, secrets) if result.degraded else result.degraded,
        )

    @classmethod
    def killed(
        cls, request: RunRequest, *, reason: str, limit_s: float, worker: str, now: float
    ) -> RunOutcome:
        """A run that never reported (hard time limit, lost process): a timeout of unknown
        start, so the delay EWMA is left as it was and the cost is pinned to the ceiling."""
        return cls(
            job_id=request.job_id,
            lease_token=request.lease_token,
            scheduled_at=request.scheduled_at,
            status=RunStatus.TIMEOUT,
            latency_ms=round(limit_s * 1000.0, 3),
            duration_ms=round(limit_s * 1000.0, 3),
            timed_out=True,
            error_class="timeout",
            error=reason,
            started_at=None,
            finished_at=now,
            worker=worker,
            timeout_s=request.timeout_s,
        )

    def summary(self) -> dict[str, Any]:
        """The task's return value: what an operator reads in the worker's log line and in
        Flower (the outcome itself goes to the post-exec write, :mod:`workers.run_start`)."""
        return {
            "job_id": self.job_id,
            "status": str(self.status),
            "latency_ms": self.latency_ms,
            "error_class": self.error_class,
        }

    def record(self) -> RunRecord:
        """The run's history record (the lane is filled in where the job is read)."""
        return RunRecord(
            status=self.status,
            region=split_job_id(self.job_id)[1],
            finished_at=self.finished_at,
            scheduled_at=self.scheduled_at,
            started_at=self.started_at,
            latency_ms=self.latency_ms,
            duration_ms=self.duration_ms,
            timed_out=self.timed_out,
            timeout_s=self.timeout_s,
            error_class=self.error_class,
            error=self.error,
            worker=self.worker or None,
            queue=self.queue or None,
            detail=dict(self.detail),
            degraded=self.degraded,
        )
