"""The ``checkbeat.run_check`` message: what the dispatcher publishes and the worker consumes.

Contract (task defined in ``workers``, published by name from ``beat``):

- task name :data:`RUN_CHECK_TASK`, queue ``keys.check_queue(region, lane)``;
- kwargs (JSON): ``job_id``, ``lease_token``, ``scheduled_at`` and ``effective_scheduled_at``
  (Unix s floats), ``timeout_s``;
- ``soft_time_limit`` = ``Params.execution_timeout(cost_ewma_ms)``, ``time_limit`` = that +
  :data:`HARD_LIMIT_MARGIN_S`.

The worker should check ``jobs.lease_is_current(job_id, lease_token)`` before probing (the
check may have been deleted, or the lease reaped, while the message waited) and finish with
``jobs.finish_run`` / ``jobs.complete_run`` using the same token, then
``dispatch.refill_after_run(app, region)`` to refill the slot it freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_app.publish import TaskMessage
from celery_app.redis.schema import check_queue, split_job_id
from scheduling_core import Params

RUN_CHECK_TASK = "checkbeat.run_check"
#: Seconds between the soft limit (the probe's timeout) and Celery's hard kill.
HARD_LIMIT_MARGIN_S = 2.0


def time_limits(params: Params, cost_ewma_ms: float) -> tuple[float, float]:
    """(soft, hard) time limits in seconds for a job with this cost EWMA."""
    soft = params.execution_timeout(cost_ewma_ms).total_seconds()
    return soft, soft + HARD_LIMIT_MARGIN_S


def lease_seconds(params: Params, lease_margin_s: float) -> float:
    """How long a claim holds its job: the ceiling's hard limit plus a margin.

    The ceiling bounds every job's own hard limit, so the claim script needs none of the timeout
    math; a lost job is reaped at most this long after its claim.
    """
    ceiling = params.effective_check_timeout().total_seconds()
    return ceiling + HARD_LIMIT_MARGIN_S + lease_margin_s


@dataclass(frozen=True)
class RunCheck:
    """The kwargs of one ``checkbeat.run_check`` message."""

    job_id: str
    lease_token: str
    scheduled_at: float
    effective_scheduled_at: float
    timeout_s: float

    def kwargs(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "lease_token": self.lease_token,
            "scheduled_at": self.scheduled_at,
            "effective_scheduled_at": self.effective_scheduled_at,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> RunCheck:
        return cls(
            job_id=str(kwargs["job_id"]),
            lease_token=str(kwargs["lease_token"]),
            scheduled_at=float(kwargs["scheduled_at"]),
            effective_scheduled_at=float(kwargs["effective_scheduled_at"]),
            timeout_s=float(kwargs["timeout_s"]),
        )

    @property
    def region(self) -> str:
        return split_job_id(self.job_id)[1]


def run_check_message(
    params: Params,
    *,
    job_id: str,
    lease_token: str,
    lane: int,
    scheduled_at: float,
    effective_scheduled_at: float,
    cost_ewma_ms: float,
) -> TaskMessage:
    """The TaskMessage the dispatcher publishes for one claimed job."""
    soft, hard = time_limits(params, cost_ewma_ms)
    body = RunCheck(job_id, lease_token, scheduled_at, effective_scheduled_at, soft)
    return TaskMessage(
        name=RUN_CHECK_TASK,
        queue=check_queue(body.region, lane),
        kwargs=body.kwargs(),
        time_limit=hard,
        soft_time_limit=soft,
    )
