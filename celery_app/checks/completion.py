"""The completion of a check run: the one write after it (``complete.lua``), by the worker or,
for a lost run, by the reaper.

The write releases the lease, folds the run into the job (EWMAs, lane, effective deadline, run
count), places the job at its next tick, records the result and, when the region's state
moved, the check's state and its transition: one script call, idempotent per lease token.
:class:`CompleteCall` is its only call site and owns its KEYS and its plan (ARGV, one JSON
object with named fields).

A worker plans the write from what its run read when it started (``checks.start_read``): the
job, with Redis's time advanced by the worker's monotonic clock, and the maintenance version
its process last read. Nothing but the run's own completion changes a leased job, so the plan
holds unless an edit, a pause, a quorum transition, a window's hold on the check or (for a run
that counts the check's state) a maintenance change came meanwhile; ``complete.lua`` checks that
atomically (``jobs.ReadGuard``) and writes nothing when it finds one, and the worker reads again
and plans again (:func:`finish_run_with_health`, also its write for a run with no start read:
one killed by its hard time limit). The refill's reads ride on the same round trip, after the
write. The reaper writes the runs it finds lost in one round trip (:func:`complete_runs_each`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import redis

from celery_app.checks.check_state import HealthUpdate, Prefetching
from celery_app.checks.claiming import Claim, check_claim, lease_token_prefix
from celery_app.checks.jobs import (
    DEFAULT_RESULTS_MAXLEN,
    CompletedRun,
    JobState,
    ReadGuard,
    format_ts,
    from_unix,
    plan_completion,
    to_unix,
)
from celery_app.checks.ratelimit import KNOWN_LIMITED
from celery_app.checks.run_contract import RunRecord
from celery_app.redis.clock import from_time_reply
from celery_app.redis.replication import queue_wait, took_wait
from celery_app.redis.schema import Keys, split_job_id
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW, Params

#: complete.lua's status when its guard found the job or the maintenance windows changed.
STALE = -1


@dataclass(frozen=True)
class Handoff:
    """A worker's completion hands the slot it frees to the region's next ready job, in the
    same call (see complete.lua's header for when it may): ``worker`` is the hostname it is
    registered under, ``lease_s`` a claim's lease (``run_contract.lease_seconds``), ``now`` the
    Redis time the run's write was planned at (``workers.run_start.RunStart.now``: the start
    read's ``TIME`` advanced by the worker's monotonic clock). The handed job's lease runs from
    it and the refill's cut-off is it, so the completion asks the server for no ``TIME`` of its
    own; it trails the server's by the start read's reply latency at most, which only makes a
    lease end and a cut-off earlier, never a start early.

    ``live``: whether the freed slot is a live one (the worker registered, no probe of it
    holding a slot past its deadline), as the process that registered the worker knows it
    (``workers.roles.slots_known_live``); None when this process does not keep the
    registration (a prefork pool's child), and then the script reads the worker's hash. The
    registering process knows better than its hash: the hash may have expired while the worker
    runs (its heartbeat failed), and a warm shutdown stops the registration before it deletes
    the hash."""

    worker: str
    region: str
    lease_s: float
    lease_lane: int | None = None  # the lane of the queue the run came from, if known
    _: KW_ONLY
    now: float
    live: bool | None = None

    @cached_property
    def token(self) -> str:
        """The handed lease's token, one per hand-off: the first of a claim's
        (:func:`~celery_app.checks.claiming.lease_token_prefix`)."""
        return f"{lease_token_prefix()}.1"

    def script_keys(self, keys: Keys) -> list[str]:
        """complete.lua's hand-off KEYS (H .. H+4, see its header)."""
        return [
            keys.worker(self.worker),
            keys.ready(self.region, LANE_FAST),
            keys.ready(self.region, LANE_SLOW),
            keys.held_tenants(self.region),
            keys.rate_limited_tenants(),
        ]

    def claim_of(self, line: str) -> Claim | None:
        """The job handed the slot, from the reply's line ('' = none); a ValueError when its
        stored numbers are no numbers a run can carry."""
        if not line:
            return None
        job, scheduled, effective, cost, lane, token = line.split(" ")
        claim = Claim(
            job, self.region, int(lane), token, float(scheduled), float(effective), float(cost)
        )
        check_claim(claim)
        return claim


@dataclass(frozen=True)
class Completed:
    """What a completion with a hand-off did: whether it wrote (and the transition it made),
    the hand-off's line ('' when no job was handed the slot), and what a refill would find
    (the replies :class:`~celery_app.checks.dispatch.RefillNeeds` reads)."""

    written: bool
    transition: str | None
    handed: str  # the hand-off's line: parse with Handoff.claim_of
    refill_needs: list[Any]


@dataclass(frozen=True)
class CompleteCall:
    """One ``complete.lua`` call: the keys it touches and its plan, built from a
    :class:`~celery_app.checks.jobs.CompletedRun` (and the guard of a planned write)."""

    keys: list[str]
    plan: dict[str, Any]

    @classmethod
    def of(
        cls,
        keys: Keys,
        run: CompletedRun,
        results_maxlen: int,
        guard: ReadGuard | None = None,
        handoff: Handoff | None = None,
        *,
        run_ended: bool = False,
        limited: frozenset[str] | None = None,
    ) -> CompleteCall:
        """``limited``: the region's tenants with a bucket as the process knows them, fresh
        (``ratelimit.KNOWN_LIMITED``), for the hand-off; None: the script asks Redis."""
        uid, region = split_job_id(run.job_id)
        state = run.state
        plan: dict[str, Any] = {
            "id": run.job_id,
            "cost": repr(float(state.cost_ewma_ms)),
            "delay": repr(float(state.delay_ewma_ms)),
            "ea": format_ts(to_unix(state.effective_scheduled_at)),
            "lane": str(int(state.lane)),
            "sa": format_ts(to_unix(run.next_scheduled_at)),
            "region": region,
            "maxlen": str(results_maxlen),
        }
        if run.lease_token is not None:  # None: a job that holds no lease (a heartbeat's)
            plan["token"] = run.lease_token
        if run.passed:
            plan["passed"] = str(run.passed)
        if run.record is not None:
            plan["record"] = run.record.to_json()
        if guard is not None:
            plan["guard"] = guard.plan()
        if run_ended:  # a heartbeat's success or fail ping: the started run is over
            plan["run_ended"] = "1"
        script_keys = [
            keys.job(run.job_id),
            keys.due(),
            keys.leases(region, 0),
            keys.leases(region, 1),
            keys.results(uid),
            keys.last_result(uid),
            keys.maintenance_version(),
        ]
        if handoff is not None:
            plan["handoff"] = {
                "lease_s": f"{handoff.lease_s:.6f}",
                "now": f"{handoff.now:.6f}",
                "token": handoff.token,
            }
            if handoff.live is not None:
                plan["handoff"]["live"] = "1" if handoff.live else "0"
            if limited is not None:  # a JSON object: the script looks a tenant up in it
                plan["handoff"]["limited"] = dict.fromkeys(sorted(limited), 1)
            if handoff.lease_lane is not None:
                plan["lease_lane"] = str(handoff.lease_lane)
            script_keys += handoff.script_keys(keys)
        if run.health is not None:
            plan["health"] = run.health.plan()
            script_keys += run.health.script_keys(keys)
        return cls(script_keys, plan)

    def queue(self, pipe: Any) -> None:
        run_script(pipe, "complete", self.keys, [json.dumps(self.plan, separators=(",", ":"))])


def queue_complete(
    pipe: Any, keys: Keys, run: CompletedRun, maxlen: int, guard: ReadGuard | None = None
) -> None:
    """Queue ``run``'s write on ``pipe`` (its reply: :func:`completion_reply`)."""
    CompleteCall.of(keys, run, maxlen, guard).queue(pipe)


def completion_reply(reply: Any) -> tuple[bool, str | None] | None:
    """complete.lua's reply as (written, the id of the transition it made or None); None when
    its guard refused (nothing written)."""
    status = int(reply[0])
    if status == STALE:
        return None
    return status == 1, (reply[1] or None) if status == 1 else None


def complete_as_read(
    client: redis.Redis,
    keys: Keys,
    run: CompletedRun,
    guard: ReadGuard,
    handoff: Handoff,
    *,
    results_maxlen: int,
) -> Completed | None:
    """Write ``run`` if the job and the maintenance version are as ``guard`` read them, and
    hand the freed slot off, in one round trip; None when the guard refused (nothing
    written, nothing handed)."""
    limited = KNOWN_LIMITED.fresh(keys)
    pipe = client.pipeline(transaction=False)
    CompleteCall.of(keys, run, results_maxlen, guard, handoff, limited=limited).queue(pipe)
    refresh = limited is None and KNOWN_LIMITED.due(keys)
    if refresh:  # for the completions after this one
        sent = time.monotonic()
        pipe.smembers(keys.rate_limited_tenants())
    # Replicated before the slot is refilled: a completion lost in a failover runs its tick again.
    queued = queue_wait(pipe, client)
    reply, *rest = took_wait(pipe.execute(), queued, client, "a check completion")
    if refresh:
        KNOWN_LIMITED.read(keys, rest[0], sent)
    done = completion_reply(reply)
    if done is None:
        return None
    written, transition = done
    if not written:
        return Completed(False, None, "", [])
    handed, *needs = reply[2:]
    return Completed(True, transition, handed, [needs])


def complete_runs_each(
    client: redis.Redis,
    keys: Keys,
    runs: Sequence[CompletedRun],
    *,
    results_maxlen: int = DEFAULT_RESULTS_MAXLEN,
) -> list[tuple[bool, str | None] | Exception]:
    """Write back many runs in one round trip: for each, (written, the id of the transition it
    made or None), or the error of its script in its place (the others are written): the
    reaper quarantines those jobs. A run is written only while its lease token is current."""
    if not runs:
        return []
    pipe = client.pipeline(transaction=False)
    for run in runs:
        queue_complete(pipe, keys, run, results_maxlen)
    # Replicated before the slot is refilled: a completion lost in a failover runs its tick again.
    queued = queue_wait(pipe, client)
    replies = took_wait(pipe.execute(raise_on_error=False), queued, client, "a check completion")
    return [x if isinstance(x, Exception) else _unguarded(completion_reply(x)) for x in replies]


def _unguarded(reply: tuple[bool, str | None] | None) -> tuple[bool, str | None]:
    if reply is None:
        raise RuntimeError("complete.lua refused an unguarded write as stale")
    return reply


def finish_run_with_health(
    client: redis.Redis,
    keys: Keys,
    params: Params,
    job_id: str,
    lease_token: str,
    *,
    duration_ms: float,
    timed_out: bool,
    exec_start: datetime | None,
    now: datetime | None = None,
    record: RunRecord | None = None,
    scheduled_at: float | None = None,
    results_maxlen: int = DEFAULT_RESULTS_MAXLEN,
    health_of: Callable[[JobState, datetime], HealthUpdate | None],
) -> tuple[bool, str | None]:
    """The worker's write when it has no start read to plan from (a killed run) or its planned
    write was refused as stale: read the job, fold the run with ``post_exec`` and write it, the
    check's state with it, in one Lua call (``record`` gets the lane the job was claimed in:
    the stored one, before this run moves it).

    ``health_of(job, now)`` (see :mod:`celery_app.checks.check_state`) decides the region's step and
    whether a maintenance window holds transitions back (the record is then marked); a
    ``health_of`` that is also :class:`~celery_app.checks.check_state.Prefetching` adds its reads to
    the job's round trip. The next tick is computed at ``now``, by default the Redis server's
    time (read with the job), not the caller's clock, and is always after the run's tick
    (:meth:`JobState.next_scheduled_at`). ``exec_start`` stays on the worker's clock: it only
    feeds the delay EWMA (telemetry; a start that looks early counts as on time).

    Returns (written, the id of the transition the run made or None); not written when the job
    is gone or its lease is no longer ``lease_token``."""
    # One round trip: the job, Redis's time, and what health_of reads with them (prefetch).
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.job(job_id))
    if now is None:
        pipe.time()
    prefetching = health_of if isinstance(health_of, Prefetching) else None
    if prefetching is not None:
        prefetching.prefetch(pipe)
    replies = pipe.execute()
    h, rest = replies[0], replies[1:]
    if now is None:
        now = from_unix(from_time_reply(rest.pop(0)))
    if prefetching is not None:
        prefetching.prefetched(rest)
    job = JobState.from_hash(job_id, h) if h else None
    if job is None or job.lease_token != lease_token:
        return False, None
    run = plan_completion(
        params,
        job,
        lease_token,
        now=now,
        duration_ms=duration_ms,
        timed_out=timed_out,
        exec_start=exec_start,
        record=record,
        scheduled_at=scheduled_at,
        health_of=health_of,
    )
    (done,) = complete_runs_each(client, keys, [run], results_maxlen=results_maxlen)
    if isinstance(done, Exception):
        raise done
    return done
