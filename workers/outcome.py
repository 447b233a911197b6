"""The run message a worker accepts, and the outcome of one run as a value.

Why values: the run task and the post-exec signal handler are two functions that Celery calls at
different moments (and, for a hard time limit, in different processes); the outcome is what
passes between them, and it must survive JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from celery_app.redis.schema import split_job_id
from workers.probes.result import ProbeResult

_FLOAT_FIELDS = ("scheduled_at", "effective_scheduled_at", "timeout_s")


class BadRunMessage(ValueError):
    """A ``checkbeat.run_check`` message is malformed; the message names the field."""


@dataclass(frozen=True)
class RunRequest:
    """The kwargs of one ``checkbeat.run_check`` message, type-checked."""

    job_id: str
    lease_token: str
    scheduled_at: float
    effective_scheduled_at: float
    timeout_s: float

    @property
    def uid(self) -> str:
        return split_job_id(self.job_id)[0]

    @property
    def region(self) -> str:
        return split_job_id(self.job_id)[1]

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any] | None) -> RunRequest:
        """Check every field's presence and type (no coercion: a string is not a number)."""
        if not isinstance(kwargs, Mapping):
            raise BadRunMessage(f"kwargs must be an object, got {type(kwargs).__name__}")
        values: dict[str, Any] = {}
        for name in ("job_id", "lease_token"):
            value = kwargs.get(name)
            if not isinstance(value, str) or not value:
                raise BadRunMessage(f"{name} must be a non-empty string, got {value!r}")
            values[name] = value
        try:
            split_job_id(values["job_id"])
        except ValueError as exc:
            raise BadRunMessage(f"job_id: {exc}") from None
        for name in _FLOAT_FIELDS:
            value = kwargs.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRunMessage(f"{name} must be a number (Unix seconds), got {value!r}")
            if not math.isfinite(value):
                raise BadRunMessage(f"{name} must be finite, got {value!r}")
            values[name] = float(value)
        if values["timeout_s"] <= 0:
            raise BadRunMessage(f"timeout_s must be > 0, got {values['timeout_s']!r}")
        # Extra fields are ignored: a newer dispatcher may add some before the workers update.
        return cls(**values)


def iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


@dataclass(frozen=True)
class RunOutcome:
    """One finished run: what the post-exec handler folds and the results history keeps."""

    job_id: str
    lease_token: str
    scheduled_at: float
    status: str
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
            status=result.status,
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
            status="timeout",
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
        """JSON-ready, for the task's return value (the post-exec handler reads it back)."""
        return {"checkbeat_outcome": asdict(self) | {"detail": dict(self.detail)}}

    @classmethod
    def from_message(cls, value: Any) -> RunOutcome | None:
        if isinstance(value, Mapping) and isinstance(value.get("checkbeat_outcome"), Mapping):
            return cls(**value["checkbeat_outcome"])
        return None

    def history_record(self) -> dict[str, Any]:
        """What the results stream and the last-result hash keep for this run."""
        _uid, region = split_job_id(self.job_id)
        return {
            "status": self.status,
            "latency_ms": self.latency_ms,
            "error_class": self.error_class,
            "error": self.error,
            "region": region,
            "scheduled_at": iso(self.scheduled_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "worker": self.worker,
            "queue": self.queue,
            "timeout_s": self.timeout_s,
            "duration_ms": self.duration_ms,
            "detail": dict(self.detail),
        }
