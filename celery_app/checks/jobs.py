"""The (check, region) job: its Redis layout, a typed read, and the plan of the write after
each run.

Layout of ``Keys.job(job_id)`` (job id = ``<uid>@<region>``; short field names keep the hash a
small listpack, under 512 bytes per job with its index entries). The names are defined, and
documented authoritatively, by :class:`celery_app.redis.schema.JobField`; this table is the
overview (Python spells them ``JobField.SCHEDULED_AT``, Lua ``JOB.SCHEDULED_AT``):

====  ===========================================================  ==========================
name  meaning                                                      written by
====  ===========================================================  ==========================
t     tenant                                                       store
w     plan_weight (int)                                            store
p     period, whole seconds                                        store
g     the check's regions, comma list (phase = index in sorted g)  store
s     region_spread override in seconds; absent = the default      store
sa    scheduled_at, Unix s                                         store, complete, claim (*)
ea    effective_scheduled_at, Unix s (the WFQ order key)           store, complete
c     cost_ewma_ms (absent = 0)                                    complete
d     delay_ewma_ms (absent = 0)                                   complete
l     lane, 0 fast / 1 slow (absent = 0)                           complete
n     runs completed (or reaped)                                   complete
sk    runs skipped by the tenant rate limit                        claim (on release)
ab    ticks lost to runs that raised before their probe            abandon
ps    ticks passed over: due while a run was late or still running complete
lt    lease token, only while claimed                              claim; complete removes it
lx    lease expiry, Unix s, only while claimed                     claim; complete removes it
off   "1" while the check is disabled (the job is in no index)     store
ft    failure_threshold ("" = the settings default)                store
st    success_threshold ("" = the settings default)                store
q     quorum ("" = a majority of the regions)                      store
pd    a digest of the check's kind, target and config              store
hs    the region's state: up / degraded / down (absent = up)       complete
hk    the state the current run of identical results points to     complete
hn    how many results in a row point to hk                        complete
cb    the quorum and regions the region last counted the check by  complete
hd    "1" while a window holds the check's change back             complete, release
====  ===========================================================  ==========================

The uid and region come from the job id; kind, target and config from the check hash (one
copy per check), which a worker reads only when ``pd`` is not the digest of the copy it keeps
(``checks.start_read``). (*) a rate-limited job's ``sa`` moves on to its latest tick, ``ea`` stays.

Where a job is: in ``Keys.due`` (score sa) waiting for its tick, in ``Keys.ready(region, lane)``
(score ea) due and waiting for a slot, in ``Keys.held(region, lane, tenant)`` (score ea) due but
turned away by the tenant's token bucket, or in ``Keys.leases(region, lane)`` (score lx) claimed.

How a run is finished (the worker, ``workers.post_exec``; the dispatcher's reaper for expired
leases, ``dispatch.Dispatcher.reap``):

1. the job as the run finds it: the worker's start read (``checks.start_read``, with its
   :class:`ReadGuard`), read again when that is missing or stale; the reaper's own read.
2. the plan, a :class:`CompletedRun`: the next tick (strictly after the run's, at ``now``,
   Redis's time: ``celery_app.redis.clock``), ``params.post_exec`` folding the run into the
   EWMAs, lane and effective deadline, and the check's state step. :func:`plan_completion`
   makes it for the worker (pure but for ``health_of``); the reaper makes its own, a lost run.
3. its write, one ``complete.lua`` call (``completion.CompleteCall``): if the job's lease token
   is still the run's it writes the job, releases the lease, places the job in ``due`` at its
   next tick, appends the record (a :class:`~celery_app.checks.run_contract.RunRecord`) to the
   capped results stream and the last-result hash and moves the check's state; otherwise
   (reaped, deleted, claimed again) it writes nothing, so a run is never recorded twice.
4. a worker whose run was written refills the slot it freed
   (``dispatch.refill_after_run``), unless the same call handed it to the next ready job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import redis

from celery_app.checks.check_state import HealthUpdate
from celery_app.checks.run_contract import RunRecord
from celery_app.redis.clock import from_time_reply
from celery_app.redis.schema import JobField, Keys, split_job_id
from scheduling_core import (
    LANE_FAST,
    Params,
    PostExecInput,
    PostExecState,
    next_aligned,
    region_spread,
)
from scheduling_core.health import RegionHealth, State

DEFAULT_RESULTS_MAXLEN = 100


def format_ts(seconds: float) -> str:
    """How times are stored: Unix seconds with millisecond precision."""
    return f"{seconds:.3f}"


def to_unix(t: datetime) -> float:
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t!r}: pass a timezone-aware datetime")
    return t.timestamp()


def from_unix(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _float(value: str | None, default: float = 0.0) -> float:
    return float(value) if value not in (None, "") else default


def _opt_int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


@dataclass(frozen=True)
class JobState:
    """A job's stored scheduling state, as the worker and the reaper need it."""

    job_id: str
    uid: str
    region: str
    tenant: str
    plan_weight: int
    period_s: int
    regions: tuple[str, ...]
    region_spread_s: float | None
    scheduled_at: float
    effective_scheduled_at: float
    cost_ewma_ms: float
    delay_ewma_ms: float
    lane: int
    runs: int
    skipped: int
    lease_token: str | None
    lease_expiry: float | None
    enabled: bool
    failure_threshold: int | None = None
    success_threshold: int | None = None
    quorum: int | None = None
    health: RegionHealth = field(default_factory=RegionHealth)
    abandoned: int = 0  # ticks lost to runs that raised before their probe (checks.abandon)
    passed: int = 0  # ticks passed over by runs that ended late (:meth:`ticks_passed`)

    @classmethod
    def from_hash(cls, job_id: str, h: dict[str, str]) -> JobState:
        uid, region = split_job_id(job_id)
        spread = h.get(JobField.REGION_SPREAD)
        expiry = h.get(JobField.LEASE_EXPIRY)
        return cls(
            job_id=job_id,
            uid=uid,
            region=region,
            tenant=h.get(JobField.TENANT, ""),
            plan_weight=int(h.get(JobField.PLAN_WEIGHT) or 0),
            period_s=int(h.get(JobField.PERIOD) or 0),
            regions=tuple(x for x in h.get(JobField.REGIONS, "").split(",") if x),
            region_spread_s=float(spread) if spread not in (None, "") else None,
            scheduled_at=_float(h.get(JobField.SCHEDULED_AT)),
            effective_scheduled_at=_float(h.get(JobField.EFFECTIVE_AT)),
            cost_ewma_ms=_float(h.get(JobField.COST_EWMA_MS)),
            delay_ewma_ms=_float(h.get(JobField.DELAY_EWMA_MS)),
            lane=int(h.get(JobField.LANE) or LANE_FAST),
            runs=int(h.get(JobField.RUNS) or 0),
            skipped=int(h.get(JobField.SKIPPED) or 0),
            abandoned=int(h.get(JobField.ABANDONED) or 0),
            passed=int(h.get(JobField.PASSED) or 0),
            lease_token=h.get(JobField.LEASE_TOKEN) or None,  # '' once a run released it
            lease_expiry=float(expiry) if expiry else None,
            enabled=h.get(JobField.DISABLED) != "1",
            failure_threshold=_opt_int(h.get(JobField.FAILURE_THRESHOLD)),
            success_threshold=_opt_int(h.get(JobField.SUCCESS_THRESHOLD)),
            quorum=_opt_int(h.get(JobField.QUORUM)),
            health=RegionHealth(
                State(h.get(JobField.HEALTH) or State.UP),
                State(h.get(JobField.STREAK_STATE) or State.UP),
                int(h.get(JobField.STREAK) or 0),
            ),
        )

    @property
    def period(self) -> timedelta:
        return timedelta(seconds=self.period_s)

    def spread(self) -> timedelta:
        """The resolved inter-region offset (the override, else period / number of regions)."""
        override = None if self.region_spread_s is None else timedelta(seconds=self.region_spread_s)
        return region_spread(self.period, len(self.regions), override)

    def next_scheduled_at(self, now: datetime, run_scheduled_at: float | None = None) -> datetime:
        """The job's next tick after ``now`` and strictly after the tick just run.

        ``next_aligned`` with its stored phase inputs, from the later of ``now`` and the run's
        tick (the stored ``sa``, which a claimed job keeps, or ``run_scheduled_at``): a clock
        behind the one that made the tick due can then never store that same tick again, and
        the job never runs twice for one tick, whatever ``now`` says.
        """
        run_tick = max(self.scheduled_at, run_scheduled_at or 0.0)
        after = max(now, from_unix(run_tick)) if run_tick else now
        return next_aligned(
            after, self.period, self.period, self.uid, self.region, self.regions, self.spread()
        )

    def ticks_passed(self, next_at: datetime, run_scheduled_at: float | None = None) -> int:
        """The ticks strictly between the run's tick and ``next_at``: due while the run was
        late or still running, and not run (the next tick is planned after the run's end).

        Ticks sit in the Unix seconds of the job's phase (``next_aligned``), so the whole
        seconds between two of them count the periods apart; 0 for a run that ended before
        its next tick, or a job without a period."""
        run_tick = max(self.scheduled_at, run_scheduled_at or 0.0)
        if self.period_s <= 0 or not run_tick:
            return 0
        apart = (math.floor(to_unix(next_at)) - math.floor(run_tick)) / self.period_s
        return max(0, round(apart) - 1)

    def post_exec_input(
        self,
        *,
        duration_ms: float,
        timed_out: bool,
        exec_start: datetime | None,
        next_scheduled_at: datetime,
        scheduled_at: float | None = None,
    ) -> PostExecInput:
        """The PostExecInput of one run of this job (``scheduled_at`` defaults to the stored one;
        pass the message's scheduled_at when you have it)."""
        sched = self.scheduled_at if scheduled_at is None else scheduled_at
        return PostExecInput(
            prev_cost_ewma_ms=self.cost_ewma_ms,
            prev_delay_ewma_ms=self.delay_ewma_ms,
            prev_lane=self.lane,
            plan_weight=self.plan_weight,
            scheduled_at=from_unix(sched) if sched else None,
            effective_scheduled_at=(
                from_unix(self.effective_scheduled_at) if self.effective_scheduled_at else None
            ),
            duration_ms=duration_ms,
            timed_out=timed_out,
            exec_start=exec_start,
            next_scheduled_at=next_scheduled_at,
        )


def read_job(client: redis.Redis, keys: Keys, job_id: str) -> JobState | None:
    """The job's stored state, or None when it does not exist (deleted check or region)."""
    h = cast("dict[str, str]", client.hgetall(keys.job(job_id)))  # decode_responses=True
    return JobState.from_hash(job_id, h) if h else None


def read_job_and_time(
    client: redis.Redis, keys: Keys, job_id: str
) -> tuple[JobState | None, float]:
    """:func:`read_job` and the Redis server's time, in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.job(job_id))
    pipe.time()
    h, reply = pipe.execute()
    return (JobState.from_hash(job_id, h) if h else None), from_time_reply(reply)


def _job_hashes(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[dict[str, str]]:
    """The raw hashes of many jobs, in one round trip ({} for a job that does not exist)."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job(job_id))
    return pipe.execute()


def read_jobs(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[JobState | None]:
    """:func:`read_job` for many jobs in one round trip."""
    return [
        JobState.from_hash(j, h) if h else None
        for j, h in zip(job_ids, _job_hashes(client, keys, job_ids), strict=True)
    ]


#: What decoding a job hash raises on a torn field (a bad number, a bad state name).
DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, ArithmeticError, TypeError)


@dataclass(frozen=True)
class UnreadableJob:
    """A job hash that does not parse (a field torn by hand, a bad restore, a bug). Reports
    show it with the reason instead of failing on it; the dispatch steps quarantine it."""

    job_id: str
    reason: str


def read_jobs_for_report(
    client: redis.Redis, keys: Keys, job_ids: Sequence[str]
) -> list[JobState | UnreadableJob | None]:
    """:func:`read_jobs` for read-only views: a job that cannot be decoded is an
    :class:`UnreadableJob`, so one torn hash never hides every other job from an operator."""
    out: list[JobState | UnreadableJob | None] = []
    for j, h in zip(job_ids, _job_hashes(client, keys, job_ids), strict=True):
        if not h:
            out.append(None)
            continue
        try:
            out.append(JobState.from_hash(j, h))
        except DECODE_ERRORS as exc:
            out.append(UnreadableJob(j, f"{type(exc).__name__}: {exc}"))
    return out


def lease_is_current(client: redis.Redis, keys: Keys, job_id: str, lease_token: str) -> bool:
    """Whether ``lease_token`` still holds the job: a worker checks it before running a message
    that may have been reaped or deleted while it waited in the queue."""
    return client.hget(keys.job(job_id), JobField.LEASE_TOKEN) == lease_token


@dataclass(frozen=True)
class CompletedRun:
    """One run to write back (``completion.CompleteCall``), as :func:`plan_completion` plans it."""

    job_id: str
    lease_token: str | None  # None: a job that holds no lease (a heartbeat's ping or miss)
    state: PostExecState
    next_scheduled_at: datetime
    record: RunRecord | None = None
    health: HealthUpdate | None = None  # None: the check's state is not moved by this run
    passed: int = 0  # ticks between the run's and next_scheduled_at (JobField.PASSED)


#: Job fields a guarded completion does not compare: the lease, which it checks by token.
_UNGUARDED = frozenset((JobField.LEASE_TOKEN, JobField.LEASE_EXPIRY))


@dataclass(frozen=True)
class ReadGuard:
    """What a write was planned from: the job hash as a run read it when it started, and the
    maintenance version its process last read. ``complete.lua`` writes only if the job is
    unchanged, and the version too when the run counts the check's state (the windows decide
    whether a change is held), so a worker can plan its write from that read and spend one
    round trip after the probe, not two; an edit, pause, transition or a window's hold
    meanwhile, or a window changed since the version the plan was made with, sends it back to
    read again."""

    fields: dict[str, str]  # every field of the job but the lease's
    maintenance_version: str

    @classmethod
    def of(cls, job_hash: dict[str, str], maintenance_version: str | None) -> ReadGuard:
        fields = {f: v for f, v in job_hash.items() if f not in _UNGUARDED}
        return cls(fields, maintenance_version or "")

    def plan(self) -> dict[str, Any]:
        """The ``guard`` of complete.lua's plan."""
        return {
            "count": len(self.fields),
            "fields": self.fields,
            "maintenance": self.maintenance_version,
        }


def plan_completion(
    params: Params,
    job: JobState,
    lease_token: str,
    *,
    now: datetime,
    duration_ms: float,
    timed_out: bool,
    exec_start: datetime | None,
    record: RunRecord | None = None,
    scheduled_at: float | None = None,
    health_of: Callable[[JobState, datetime], HealthUpdate | None] | None = None,
) -> CompletedRun:
    """The write one run of ``job`` makes at ``now`` (Redis time), pure but for ``health_of``:
    the next tick, the folded EWMAs and lane, the check's state step, the record in the lane
    the job was claimed in (and marked when a maintenance window holds transitions back)."""
    next_at = job.next_scheduled_at(now, scheduled_at)
    passed = job.ticks_passed(next_at, scheduled_at)
    state = params.post_exec(
        job.post_exec_input(
            duration_ms=duration_ms,
            timed_out=timed_out,
            exec_start=exec_start,
            next_scheduled_at=next_at,
            scheduled_at=scheduled_at,
        )
    )
    health = health_of(job, now) if health_of is not None else None
    if record is not None:
        record = record.in_lane(job.lane)
        if health is not None and health.maintenance_until is not None:
            record = record.in_maintenance()
    return CompletedRun(job.job_id, lease_token, state, next_at, record, health, passed)
