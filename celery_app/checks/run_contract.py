"""The run contract: the ``checkbeat.run_check`` task, the request it takes, the record it leaves.

Defined once here and used by the dispatcher (publishes requests, records lost runs), the worker
task (parses requests) and post-exec (records finished and killed runs). beat and workers never
import each other; this module is what they agree on.

- **Task**: :data:`RUN_CHECK_TASK`, published to ``schema.check_queue(region, lane)`` with
  ``soft_time_limit`` = ``Params.execution_timeout(cost_ewma_ms)`` and ``time_limit`` = that +
  :data:`HARD_LIMIT_MARGIN_S` (:func:`time_limits`).
- **Request**: :class:`RunRequest`, the message kwargs (JSON, keyword arguments only):
  ``job_id`` (``<uid>@<region>``), ``lease_token``, ``scheduled_at`` and
  ``effective_scheduled_at`` (Unix s), ``timeout_s`` (the soft limit). :meth:`RunRequest.parse`
  is strict: present, typed (no coercion), finite, in range (times in [0, :data:`MAX_UNIX_S`],
  0 < ``timeout_s`` <= :func:`max_timeout_s`, ids of at most :data:`MAX_ID_CHARS` characters
  without whitespace), else :class:`BadRunMessage` naming the field. Extra fields are ignored
  so a newer dispatcher may add some before the workers update.
- **Record**: :class:`RunRecord`, the JSON each run appends to the check's results stream and
  last-result hash (``schema.ResultField``). Every path writes the same keys: a probe that ran,
  a run killed by its hard limit or lost with its process, and a lease the reaper found expired
  (status ``lost``). Keys: ``status`` (:class:`RunStatus`), ``region``, ``lane`` (the lane it was
  claimed in), ``queue``, ``worker``, ``scheduled_at``/``started_at``/``finished_at`` (ISO 8601
  UTC or null), ``latency_ms``, ``duration_ms``, ``timed_out``, ``timeout_s``, ``error_class``,
  ``error``, ``detail`` (the probe's extra data; ``{}`` when none), ``maintenance`` (true when it
  ran inside a maintenance window), ``degraded`` (why a successful run crossed a latency or
  certificate threshold, else null). Unknown values are null.

The worker checks its lease in its start read before probing (``checks.start_read``: the check
may have been deleted, or the lease reaped, while the message waited), writes its run with the
same token (``workers.post_exec``: ``completion.CompleteCall``), then refills the slot it freed
(``dispatch.refill_after_run``) unless that write handed it to the next ready job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from celery_app.errors import CheckbeatError
from celery_app.publish import TaskMessage
from celery_app.redis.schema import LANE_NAMES, check_queue, split_job_id
from scheduling_core import Params

RUN_CHECK_TASK = "checkbeat.run_check"
#: Seconds between the soft limit (the probe's timeout) and Celery's hard kill.
HARD_LIMIT_MARGIN_S = 2.0
#: Latest time a request may carry: the last second a ``datetime`` holds (9999-12-31).
MAX_UNIX_S = 253_402_300_799.0
#: Longest ``job_id`` / ``lease_token`` accepted (uids are at most 200 characters).
MAX_ID_CHARS = 512
#: The ``error_class`` of a run whose lease expired without a completion.
LOST_ERROR_CLASS = "lost"


class RunStatus(StrEnum):
    """The ``status`` of a run record: what a dashboard shows."""

    UP = "up"
    DOWN = "down"
    TIMEOUT = "timeout"  # the probe ran out of time (soft limit) or was killed (hard limit)
    LOST = "lost"  # nobody reported: the reaper found the lease expired


class BadRunMessage(CheckbeatError, ValueError):
    """A ``checkbeat.run_check`` message is malformed; the message names the field."""


def time_limits(params: Params, cost_ewma_ms: float) -> tuple[float, float]:
    """(soft, hard) time limits in seconds for a job with this cost EWMA."""
    soft = params.execution_timeout(cost_ewma_ms).total_seconds()
    return soft, soft + HARD_LIMIT_MARGIN_S


def max_timeout_s(params: Params) -> float:
    """The largest ``timeout_s`` a request may carry: the ceiling's hard limit. The dispatcher
    never sends more than the ceiling; the margin tolerates a small configuration skew."""
    return params.effective_check_timeout().total_seconds() + HARD_LIMIT_MARGIN_S


def lease_seconds(params: Params, lease_margin_s: float) -> float:
    """How long a claim holds its job: the ceiling's hard limit plus a margin.

    The ceiling bounds every job's own hard limit, so the claim script needs none of the timeout
    math; a lost job is reaped at most this long after its claim.
    """
    return max_timeout_s(params) + lease_margin_s


def _shown(value: Any) -> str:
    """``value`` for an error message, bounded (an absurd number must not flood the log)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _text(kwargs: Mapping[str, Any], name: str) -> str:
    value = kwargs.get(name)
    if not isinstance(value, str) or not value:
        raise BadRunMessage(f"{name} must be a non-empty string, got {_shown(value)}")
    if len(value) > MAX_ID_CHARS or any(c.isspace() for c in value):
        raise BadRunMessage(
            f"{name} must be at most {MAX_ID_CHARS} characters without whitespace, "
            f"got {_shown(value)}"
        )
    return value


def _number(kwargs: Mapping[str, Any], name: str, what: str) -> int | float:
    """A finite JSON number, not yet converted: 10**400 is an int that float() cannot hold, so
    ranges are compared first (1e400 arrives as inf and fails here)."""
    value = kwargs.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRunMessage(f"{name} must be a number ({what}), got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRunMessage(f"{name} must be finite, got {value!r}")
    return value


def _time(kwargs: Mapping[str, Any], name: str) -> float:
    value = _number(kwargs, name, "Unix seconds")
    if not 0 <= value <= MAX_UNIX_S:
        raise BadRunMessage(
            f"{name} must be between 0 and {MAX_UNIX_S:.0f} Unix seconds (year 9999), "
            f"got {_shown(value)}"
        )
    return float(value)


def _timeout(kwargs: Mapping[str, Any], ceiling_s: float) -> float:
    value = _number(kwargs, "timeout_s", "seconds")
    if value <= 0:
        raise BadRunMessage(f"timeout_s must be > 0, got {_shown(value)}")
    if value > ceiling_s:
        raise BadRunMessage(
            f"timeout_s must be at most {ceiling_s:g} s (the execution ceiling plus the hard "
            f"limit margin), got {_shown(value)}"
        )
    return float(value)


def run_kwargs(
    job_id: str,
    lease_token: str,
    scheduled_at: float,
    effective_scheduled_at: float,
    timeout_s: float,
) -> dict[str, Any]:
    """The wire form of a :class:`RunRequest` (built without one on the dispatcher's hot path)."""
    return {
        "job_id": job_id,
        "lease_token": lease_token,
        "scheduled_at": scheduled_at,
        "effective_scheduled_at": effective_scheduled_at,
        "timeout_s": timeout_s,
    }


@dataclass(frozen=True)
class RunRequest:
    """The kwargs of one ``checkbeat.run_check`` message (build with :meth:`parse` when they
    come from the wire; :meth:`kwargs` is the wire form)."""

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

    def kwargs(self) -> dict[str, Any]:
        return run_kwargs(
            self.job_id,
            self.lease_token,
            self.scheduled_at,
            self.effective_scheduled_at,
            self.timeout_s,
        )

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any] | None, *, max_timeout_s: float) -> RunRequest:
        """Check every field's presence, type (no coercion: a string is not a number),
        finiteness and range; ``max_timeout_s`` is :func:`max_timeout_s` of the worker's
        settings. Raises :class:`BadRunMessage` naming the first bad field."""
        if not isinstance(kwargs, Mapping):
            raise BadRunMessage(f"kwargs must be an object, got {type(kwargs).__name__}")
        job_id = _text(kwargs, "job_id")
        try:
            split_job_id(job_id)
        except ValueError as exc:
            raise BadRunMessage(f"job_id: {exc}") from None
        lease_token = _text(kwargs, "lease_token")
        scheduled_at = _time(kwargs, "scheduled_at")
        effective_scheduled_at = _time(kwargs, "effective_scheduled_at")
        timeout_s = _timeout(kwargs, max_timeout_s)
        return cls(job_id, lease_token, scheduled_at, effective_scheduled_at, timeout_s)


class RunMessages:
    """Builds the TaskMessage of each claimed job; one per batch (a tick publishes thousands:
    the time limits are computed once per distinct cost EWMA, the queue once per lane)."""

    def __init__(self, params: Params, *, wait_s: float = 0.0) -> None:
        self.params = params
        self.wait_s = wait_s  # the longest a run waits for its tick: in Celery's limits too
        self._limits: dict[float, tuple[float, float]] = {}
        self._queues: dict[tuple[str, int], str] = {}

    def message(
        self,
        *,
        job_id: str,
        region: str,
        lane: int,
        lease_token: str,
        scheduled_at: float,
        effective_scheduled_at: float,
        cost_ewma_ms: float,
    ) -> TaskMessage:
        limits = self._limits.get(cost_ewma_ms)
        if limits is None:
            limits = self._limits[cost_ewma_ms] = time_limits(self.params, cost_ewma_ms)
        queue = self._queues.get((region, lane))
        if queue is None:
            queue = self._queues[region, lane] = check_queue(region, lane)
        soft, hard = limits
        return TaskMessage(
            name=RUN_CHECK_TASK,
            queue=queue,
            # A saturated effective deadline (a huge plan weight sorts first, at year 1) is
            # carried at the contract's bound: the worker only parses it.
            kwargs=run_kwargs(
                job_id,
                lease_token,
                scheduled_at,
                min(max(effective_scheduled_at, 0.0), MAX_UNIX_S),
                soft,
            ),
            time_limit=hard + self.wait_s,
            soft_time_limit=soft + self.wait_s,
        )


def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


@dataclass(frozen=True)
class RunRecord:
    """One entry of a check's results history; :meth:`as_dict` is its one JSON shape."""

    status: RunStatus
    region: str
    finished_at: float
    scheduled_at: float | None = None
    started_at: float | None = None
    latency_ms: float | None = None
    duration_ms: float | None = None
    timed_out: bool = False
    timeout_s: float | None = None
    error_class: str | None = None
    error: str | None = None
    worker: str | None = None
    queue: str | None = None
    lane: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    maintenance: bool = False  # ran inside a maintenance window (transitions held back)
    degraded: str | None = None

    @classmethod
    def lost(cls, job_id: str, *, lane: int, scheduled_at: float, now: float) -> RunRecord:
        """The record of a run whose lease expired with no completion (the reaper's)."""
        return cls(
            status=RunStatus.LOST,
            region=split_job_id(job_id)[1],
            finished_at=now,
            scheduled_at=scheduled_at,
            timed_out=True,
            error_class=LOST_ERROR_CLASS,
            error="no completion within the hard time limit; the claim was reaped",
            lane=LANE_NAMES[lane],
        )

    def in_lane(self, lane: int) -> RunRecord:
        """This record with the lane the run was claimed in (known where the job is read)."""
        return replace(self, lane=LANE_NAMES[lane])

    def in_maintenance(self) -> RunRecord:
        """This record marked as run inside a maintenance window."""
        return replace(self, maintenance=True)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "region": self.region,
            "lane": self.lane,
            "queue": self.queue,
            "worker": self.worker,
            "scheduled_at": _iso(self.scheduled_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "latency_ms": self.latency_ms,
            "duration_ms": self.duration_ms,
            "timed_out": self.timed_out,
            "timeout_s": self.timeout_s,
            "error_class": self.error_class,
            "error": self.error,
            "detail": dict(self.detail),
            "maintenance": self.maintenance,
            "degraded": self.degraded,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))
