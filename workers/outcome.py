"""The outcome of one run as a value: what the run task hands to the post-exec handler.

Why values: the run task and the post-exec signal handler are two functions that Celery calls at
different moments (and, for a hard time limit, in different processes); the outcome is what
passes between them, and it must survive JSON (it travels as the task's return value).

Why it stays here and not in the run contract: it is the worker's private hand-off (it carries
the lease token and the probe's duration to the one write); what leaves the worker is the
contract's :class:`~celery_app.checks.run_contract.RunRecord`, built by :meth:`record`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    ) -> RunOutcome:
        return cls(
            job_id=request.job_id,
            lease_token=request.lease_token,
            scheduled_at=request.scheduled_at,
            status=RunStatus(result.status),
            latency_ms=round(result.latency_ms, 3),
            duration_ms=round(duration_ms, 3),
            timed_out=result.timed_out,
            error_class=result.error_class,
            error=result.error,
            started_at=started_at,
            finished_at=finished_at,
            worker=worker,
            timeout_s=request.timeout_s,
            queue=queue,
            detail=dict(result.detail),
            degraded=result.degraded,
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

    def as_message(self) -> dict[str, Any]:
        """JSON-ready, for the task's return value (the post-exec handler reads it back).

        The fields travel as one JSON string: Celery's success log line ``saferepr``s the
        return value token by token on every run, and a nested dict made that ~5% of a run's
        worker CPU; a string is cut at the log's limit in one step."""
        fields = vars(self) | {"status": str(self.status), "detail": dict(self.detail)}
        return {"checkbeat_outcome": json.dumps(fields, separators=(",", ":"))}

    @classmethod
    def from_message(cls, value: Any) -> RunOutcome | None:
        carried = value.get("checkbeat_outcome") if isinstance(value, Mapping) else None
        if isinstance(carried, str):
            carried = json.loads(carried)
        if isinstance(carried, Mapping):
            fields = dict(carried)
            return cls(**fields | {"status": RunStatus(fields["status"])})
        return None

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
