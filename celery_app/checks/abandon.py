"""A run that raised before its probe: its lease released and its job placed at its next tick,
at once (``abandon.lua``).

Why not leave it to the reaper: until the lease expires (the run's timeout plus the lease
margin) the slot counts as busy and the check's ticks go by unrun, and the reaper then records
a lost run that never probed. Why the next tick and not the ready index: the tick it was claimed
for may be running elsewhere by then (a duplicate delivery) and is in any case past; placing the
job as a completion would (its next aligned tick after now on Redis's clock, strictly after the
claimed one) keeps each tick run at most once. The lost tick is counted in the job
(``JobField.ABANDONED``), so runs + rate-limit skips + abandoned ticks account for the ticks
due, and not in ``runs``: nothing was probed, nothing is recorded, the check's state does not
move.

The plan is read first (the job and Redis's time, one round trip), then written by one script
that acts only while the lease is this run's and no other delivery of it started; between the
two only the lease holder writes the job's schedule, as for the reaper's completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import redis

from celery_app.checks.jobs import format_ts, from_unix, read_job_and_time, to_unix
from celery_app.redis.schema import Keys, split_job_id
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW, Params


class AbandonReason(StrEnum):
    """Where the run raised (the ``reason`` of ``checkbeat_check_runs_abandoned_total``)."""

    START_READ = "start-read"  # its start read failed (a Redis error, a torn reply)
    BEFORE_PROBE = "before-probe"  # after the start read found the lease its own


class Abandoned(StrEnum):
    """What :func:`abandon_run` did."""

    RELEASED = "released"  # lease released, job at its next tick, the tick counted lost
    LEASE_GONE = "lease gone"  # reaped, completed, deleted or claimed again: nothing written
    STARTED_ELSEWHERE = "started elsewhere"  # another delivery of the lease started: nothing


@dataclass(frozen=True, slots=True)
class Abandonment:
    """The reply of :func:`abandon_run`: what it did, and (released) the job's next tick (Unix s)
    and the lane it was claimed in."""

    result: Abandoned
    next_scheduled_at: float | None = None
    lane: int | None = None


def abandon_run(
    client: redis.Redis,
    keys: Keys,
    params: Params,
    job_id: str,
    lease_token: str,
    task_id: str,
    *,
    scheduled_at: float,
    now: float | None = None,
) -> Abandonment:
    """Release the lease ``lease_token`` of ``job_id`` (the run ``task_id``, claimed for the
    tick ``scheduled_at``) and place the job at its next tick after ``now`` (default: Redis's
    time, read with the job). Idempotent: a second call, or one after the reaper or a
    completion, finds the lease gone and writes nothing.

    A job hash that does not decode raises (``jobs.DECODE_ERRORS``): the reaper, which
    quarantines it, takes the lease back."""
    job, server_now = read_job_and_time(client, keys, job_id)
    if job is None or job.lease_token != lease_token:
        return Abandonment(Abandoned.LEASE_GONE)
    next_at = job.next_scheduled_at(from_unix(server_now if now is None else now), scheduled_at)
    effective_at = params.effective_scheduled_at(next_at, job.cost_ewma_ms, job.plan_weight)
    next_ts = format_ts(to_unix(next_at))
    reply = _abandon_script(
        client,
        keys,
        job_id=job_id,
        lease_token=lease_token,
        task_id=task_id,
        next_scheduled_at=next_ts,
        next_effective_at=format_ts(to_unix(effective_at)),
        passed=job.ticks_passed(next_at, scheduled_at),
    )
    if reply == 1:
        return Abandonment(Abandoned.RELEASED, float(next_ts), job.lane)
    return Abandonment(Abandoned.STARTED_ELSEWHERE if reply == -1 else Abandoned.LEASE_GONE)


def _abandon_script(
    client: redis.Redis,
    keys: Keys,
    *,
    job_id: str,
    lease_token: str,
    task_id: str,
    next_scheduled_at: str,
    next_effective_at: str,
    passed: int,
) -> int:
    """``abandon.lua``, its KEYS and ARGV as its header lists them: 1 released, 0 the lease is
    not this run's, -1 another delivery of it started."""
    region = split_job_id(job_id)[1]
    reply = run_script(
        client,
        "abandon",
        [
            keys.job(job_id),
            keys.due(),
            keys.leases(region, LANE_FAST),
            keys.leases(region, LANE_SLOW),
            keys.run_started(job_id, lease_token),
        ],
        [lease_token, job_id, task_id, next_scheduled_at, next_effective_at, passed],
    )
    return int(reply)
