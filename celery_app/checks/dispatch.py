"""The check dispatcher: due -> ready -> claimed and published, and expired leases reaped.

Beat runs it every CHECKBEAT_DISPATCH_INTERVAL seconds (a driver of ``beat.CronScheduler``,
``tick()``); any number of beats may, since every write is an atomic Lua call on Redis that
re-validates what was read before it (see :mod:`celery_app.checks.claiming`). Per tick:

1. reap: leases that expired (worker killed, message lost) are finished as timed-out runs
   (cost pinned to the ceiling by ``post_exec``), recorded as lost (the run contract's
   ``RunRecord.lost``, the workers' record shape), rescheduled at the next tick;
2. promote: due jobs (scheduled_at <= now) enter their (region, lane) ready index at their
   stored effective deadline;
3. claim: per region, as many jobs as the live workers have free slots, lowest effective
   deadline first, slow ones only into shared slots, tenants' token buckets permitting;
4. publish the claims to ``checks.<region>.<lane>`` in one batch. If publishing fails the
   claims are released back into the ready index (nothing is lost or penalized).

The backlog stays in Redis, in WFQ order; Celery only ever holds what can start now.

On the tick: when a claim leaves slots free (nothing due is waiting), what is due within
``CHECKBEAT_DISPATCH_LEAD`` (default 100 ms) is promoted and claimed too, so a slot never waits
for a tick while due work waits for a slot; a claim's lease runs from the later of now and its
tick, and the message's time limits include the lead; the worker waits in its slot until the
tick on Redis's clock (``workers.tasks``). ``tick()`` reports the next due instant and
:meth:`Dispatcher.next_wait` tells beat to run again when it enters the lead
(``scheduling_core.on_tick``), not a fixed interval later: under spare capacity a check
starts on its tick, never before. Such a tick usually finds nothing due yet: it then promotes
the lead's jobs and claims them with what waits in one round (``_fill``), in effective-deadline
order, reading each region's state and candidates once.

Whose clock: Redis's. ``tick()`` and ``refill()`` take the server's time once, as the process
keeps it (``redis.clock.SERVER_CLOCK``: one ``TIME`` reading advanced by the monotonic clock,
read again every ``CLOCK_REFRESH_S``, so a tick costs no ``TIME`` round trip), and promote,
claim (lease expiries, token buckets) and reap on it, never on the calling process's wall
clock, so a beat or worker whose clock is off neither promotes work early nor reaps a live run
early. An explicit ``now`` is for tests.

Why it lives in celery_app and not only in beat: a slot freed by a finished run would stay idle
until the next tick (a 50 ms check on a 0.5 s tick uses a tenth of its slot), so the worker
calls :func:`refill_after_run` right after its run's write: the freed slot is claimed again at
once, work-conserving, with the same atomic claim. beat and workers never import each other.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import redis
from celery import Celery

from celery_app.checks.check_state import plan_health
from celery_app.checks.claiming import (
    Claim,
    FirstRound,
    Promotions,
    RegionClaimer,
    RegionSlots,
    promote_and_read,
)
from celery_app.checks.completion import complete_runs_each
from celery_app.checks.heartbeat import record_late
from celery_app.checks.jobs import CompletedRun, JobState, from_unix, to_unix
from celery_app.checks.quarantine import DATA_ERRORS, failing_alone, is_job_error, quarantine
from celery_app.checks.run_contract import RUN_CHECK_TASK, RunMessages, RunRecord, lease_seconds
from celery_app.checks.transitions import claim_and_publish, sweep
from celery_app.factory import settings_of
from celery_app.metrics import record as metrics
from celery_app.publish import BatchPublisher, Publisher, TaskMessage, make_publisher
from celery_app.redis.client import get_redis
from celery_app.redis.clock import SERVER_CLOCK, from_time_reply, server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys, QuarantineStep
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW, Params
from scheduling_core.health import State
from scheduling_core.on_tick import dispatch_wait

log = logging.getLogger(__name__)

PROMOTE_BATCH = 5000
CLAIM_BATCH = 2000
RATE_LIMITED_SCAN = 5000  # rate-limited jobs moved to their tenant's held index per region
# A refill runs after every finished run: it moves fewer, the next tick does the rest.
REFILL_RATE_LIMITED_SCAN = 200


@dataclass(frozen=True)
class ClaimResult:
    """What one :meth:`Dispatcher.claim` took: the claims, per region what its claim script saw
    first, and how many due jobs the tenants' token buckets turned away (held)."""

    claims: tuple[Claim, ...] = ()
    slots: dict[str, RegionSlots] = field(default_factory=dict)
    rate_limited: int = 0


@dataclass(frozen=True)
class TickReport:
    """What one :meth:`Dispatcher.tick` did."""

    now: float
    reaped: int = 0
    promoted: int = 0
    claims: tuple[Claim, ...] = ()
    rate_limited: int = 0
    slots: dict[str, RegionSlots] = field(default_factory=dict)
    published: int = 0
    next_due: float | None = None  # the earliest job still in the due index (Redis time)


def _as_unix(now: float | datetime) -> float:
    if isinstance(now, datetime):
        return to_unix(now)
    return float(now)


class Dispatcher:
    """``Dispatcher(app).tick(now)``; ``interval`` tells beat how often to call it.

    One dispatcher serves one partition of the check half (``partition``, see
    ``Keys.every_partition``): beat runs one per partition, and any beat runs every partition,
    as their claims are atomic."""

    def __init__(
        self,
        app: Celery,
        *,
        client: redis.Redis | None = None,
        publisher: Publisher | None = None,
        regions: Sequence[str] | None = None,
        partition: int = 0,
    ) -> None:
        settings = settings_of(app)
        self.app = app
        self.settings = settings
        self.interval = settings.dispatch_interval
        self.lead = settings.dispatch_lead
        self.keys = state_keys(settings).at(partition)
        #: beat runs this driver at once when the check store publishes here (a written tick)
        self.wake_channel = self.keys.dispatch_wake()
        self.redis = client or get_redis(settings.redis_url, settings)
        self.params = Params.from_settings(settings)
        self.regions = tuple(regions or settings.regions)
        self.lease_s = lease_seconds(self.params, settings.lease_margin)
        self._publisher = publisher
        self._claimers: dict[str, RegionClaimer] = {}
        self._upkeep_at: float | None = None  # Redis time of the last reap and sweep

    @property
    def publisher(self) -> Publisher:
        if self._publisher is None:
            self._publisher = make_publisher(self.app)
        return self._publisher

    def _now(self, now: float | datetime | None) -> float:
        """``now`` as Unix seconds; when None, the Redis server's time (the one clock authority),
        as this process keeps it."""
        return SERVER_CLOCK.now(self.redis) if now is None else _as_unix(now)

    # --- one tick ---------------------------------------------------------------------------
    def tick(self, now: float | datetime | None = None) -> TickReport:
        now_s = self._now(now)
        upkeep = self._upkeep_due(now_s)
        reaped = self.reap(now_s) if upkeep else 0
        promoted, claimed, moves = self._fill(
            now_s, self.regions, RATE_LIMITED_SCAN, one_round=True
        )
        published = self.publish(claimed.claims)
        late = bool(upkeep or moves.late)
        if late:
            self.record_late_heartbeats(now_s)
        if upkeep:
            self.sweep_transitions(now_s)
        # The next due job as the promote left it (read on its round trip), unless recording
        # late heartbeats scheduled their next deadlines since: then read again.
        fresh = moves.next_due_read and not late
        return TickReport(
            next_due=moves.next_due if fresh else self.next_due(),
            now=now_s,
            reaped=reaped,
            promoted=promoted,
            claims=claimed.claims,
            rate_limited=claimed.rate_limited,
            slots=claimed.slots,
            published=published,
        )

    def _upkeep_due(self, now_s: float) -> bool:
        """Whether this tick also reaps lapsed leases, records late heartbeats and sweeps
        transitions: once an interval (Redis time), not on every tick. Why: near a job's tick
        beat ticks every half lead to claim on time, and what the upkeep finds (a lost run, a
        late heartbeat another beat promoted, a transition nobody published) is not that
        urgent; each of these reads would cost every tick a command or more, a few per run at
        low rates. A tick whose own promote moved a heartbeat job to the late index records
        the late ones at once."""
        last = self._upkeep_at
        if last is not None and last <= now_s < last + self.interval:
            return False
        self._upkeep_at = now_s
        return True

    def next_wait(self, report: object) -> float:
        """Seconds until beat should tick again: when the next due job enters the lead."""
        if not isinstance(report, TickReport):
            return self.interval
        return dispatch_wait(report.now, report.next_due, self.lead, self.interval)

    def next_due(self) -> float | None:
        """The due instant of the earliest job not yet promoted (Redis time), None if none."""
        first = self.redis.zrange(self.keys.due(), 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def refill(
        self,
        region: str,
        now: float | datetime | None = None,
        needs: RefillNeeds | None = None,
    ) -> tuple[Claim, ...]:
        """Promote what is due and fill the free slots of ``region`` now; the claims published.

        It runs after every finished run, for work that waits: due, ready or held. Under spare
        capacity there is mostly none: one round trip (the server's time, the first due job,
        whether the region has ready or held work) settles that, and also gives the time the
        claim runs on. ``needs``: that round trip's replies, read already with the run's own
        write (:class:`RefillNeeds`), so a refill that finds nothing costs no round trip at all.

        Jobs due only within the lead are not a refill's: beat's dispatcher wakes as they enter
        it (:meth:`next_wait`) and claims them in batches. Why: near capacity such a job comes
        due after almost every run; a refill would take it one job and three round trips at a
        time, where beat takes a batch in the same three."""
        if now is None:
            now_s, waiting = needs.decide() if needs else self._refill_needs(region)
            if not waiting:
                return ()
        else:
            now_s = _as_unix(now)
        claimed = self._fill(now_s, (region,), REFILL_RATE_LIMITED_SCAN)[1]
        self.publish(claimed.claims)
        return claimed.claims

    def record_late_heartbeats(self, now_s: float) -> None:
        """Fail the heartbeat checks whose ping is late (``checks.heartbeat``: promoted into
        their late index by a tick) and publish the transitions that made; a failure waits for
        the next upkeep."""
        try:
            transitions = record_late(self.redis, self.keys, self.settings, now_s)
            if transitions:
                claim_and_publish(
                    self.app, self.redis, self.keys, self.settings, now_s, transitions
                )
        except Exception:
            log.exception("checkbeat: recording late heartbeats failed; retried next tick")

    def sweep_transitions(self, now_s: float) -> None:
        """Release transitions held by ended maintenance windows and publish the undelivered
        ones nobody holds (celery_app.checks.transitions); a failure waits for the next tick."""
        try:
            sweep(self.app, self.redis, self.keys, self.settings, now_s)
        except Exception:
            log.exception("checkbeat: the transition sweep failed; retried next tick")

    def _fill(
        self, now_s: float, regions: Sequence[str], scan: int, *, one_round: bool = False
    ) -> tuple[int, ClaimResult, Promotions]:
        """Promote and claim what is due; then, if slots are still free, what is due within the
        lead (its workers wait for the tick). (promoted, claimed, what the promotes moved).

        ``one_round`` (beat's tick): the due index is read once, through the lead. When nothing
        in it is due yet (beat woke as a job entered the lead, the usual tick under spare
        capacity), one round promotes the lead's jobs and claims them with whatever waits in the
        ready indexes, in effective-deadline order. Not a refill's: it runs because work
        waits, and the jobs due within the lead are beat's (:meth:`refill`)."""
        moves = Promotions()
        lead = self.lead if one_round else 0.0
        promoted, claimed, took_lead = self._promote_claim(
            now_s, regions, scan, self._first_rounds(regions, scan), moves, lead_s=lead
        )
        if took_lead or not self.lead or not _slots_left(claimed):
            return promoted, claimed, moves
        ahead, more, _ = self._promote_claim(
            now_s + self.lead,
            regions,
            scan,
            self._first_rounds(regions, scan),
            moves,
            claim_at=now_s,
            only_due=True,
        )
        if not ahead:
            return promoted, claimed, moves
        return (
            promoted + ahead,
            ClaimResult(
                claimed.claims + more.claims,
                claimed.slots,
                claimed.rate_limited + more.rate_limited,
            ),
            moves,
        )

    def _first_rounds(self, regions: Sequence[str], scan: int) -> list[FirstRound]:
        """Each region's first claim round, its reads to be queued on the promote's pipelines."""
        return [FirstRound(self._claimer(r), batch=CLAIM_BATCH, max_holds=scan) for r in regions]

    def _promote_claim(
        self,
        until_s: float,
        regions: Sequence[str],
        scan: int,
        firsts: Sequence[FirstRound],
        moves: Promotions,
        *,
        claim_at: float | None = None,
        only_due: bool = False,
        lead_s: float = 0.0,
    ) -> tuple[int, ClaimResult, bool]:
        """Promote what is due at ``until_s`` and claim at ``claim_at`` (default: ``until_s``):
        (promoted, claimed, whether the lead's jobs were promoted), in three round trips when a
        batch holds every due job (each region's claim reads, in ``firsts``, ride on the
        promote's, :func:`~celery_app.checks.claiming.promote_and_read`, which also reads
        ``lead_s`` ahead). ``only_due``: no claim when nothing was promoted (the lead's jobs
        after a claim that left slots)."""
        moved, took_lead = promote_and_read(
            self.redis,
            self.keys,
            until_s,
            PROMOTE_BATCH,
            moves,
            firsts,
            read_if_none_due=not only_due,
            lead_s=lead_s,
        )
        metrics.promoted(moves.ready)
        moves.ready.clear()
        if only_due and not moved:
            return 0, ClaimResult(), took_lead
        now_s = until_s if claim_at is None else claim_at
        return moved, self.claim(now_s, regions, rate_limited_scan=scan, firsts=firsts), took_lead

    def _claimer(self, region: str) -> RegionClaimer:
        claimer = self._claimers.get(region)
        if claimer is None:
            claimer = self._claimers[region] = RegionClaimer(self.redis, self.keys, region)
        return claimer

    def _refill_needs(self, region: str) -> tuple[float, bool]:
        """(Redis time, whether work waits in ``region``): one round trip."""
        needs = RefillNeeds(self.keys, region)
        pipe = self.redis.pipeline(transaction=False)
        needs.prefetch(pipe)
        needs.prefetched(pipe.execute())
        return needs.decide()

    def claim(
        self,
        now_s: float,
        regions: Sequence[str] | None = None,
        *,
        rate_limited_scan: int = RATE_LIMITED_SCAN,
        firsts: Sequence[FirstRound] = (),
    ) -> ClaimResult:
        """Claim the free slots of each region (two phases, see :mod:`claiming`); ``firsts``:
        each region's first round read already (in ``regions``' order)."""
        claims: list[Claim] = []
        slots: dict[str, RegionSlots] = {}
        limited = 0
        expiry = now_s + self.lease_s
        regions = regions or self.regions
        seeds: Sequence[FirstRound | None] = firsts or [None] * len(regions)
        for region, first in zip(regions, seeds, strict=True):
            claimer = self._claimer(region)
            try:
                taken = claimer.claim(
                    now_s, expiry, batch=CLAIM_BATCH, max_holds=rate_limited_scan, first=first
                )
            except DATA_ERRORS as exc:
                if not is_job_error(exc):
                    raise
                # no single job to blame (each one was tried alone): the other regions go on
                log.exception("claiming in region %s failed; the other regions go on", region)
                continue
            metrics.claimed(region, taken)
            slots[region] = taken.slots
            claims.extend(taken.claims)
            limited += taken.rate_limited
        return ClaimResult(tuple(claims), slots, limited)

    def _sendable(self, claims: Sequence[Claim]) -> tuple[list[Claim], list[TaskMessage]]:
        """The claims and their messages; a claim whose message cannot be built from its job's
        numbers is quarantined (its lease goes with it) and the others are sent."""
        build = RunMessages(self.params, wait_s=self.lead).message
        kept, messages = [], []
        for c in claims:
            try:
                messages.append(_message(build, c))
            except DATA_ERRORS as exc:
                now_s = server_time(self.redis)
                quarantine(self.redis, self.keys, c.job_id, QuarantineStep.PUBLISH, exc, now_s)
                continue
            kept.append(c)
        return kept, messages

    def publish(self, claims: Sequence[Claim]) -> int:
        if not claims:
            return 0
        claims, messages = self._sendable(claims)
        if not claims:
            return 0
        try:
            self.publisher.publish(messages)
        except Exception:
            log.exception("publishing %d claimed checks failed; releasing them", len(claims))
            self.release(claims)
            raise
        metrics.published(claims)
        return len(claims)

    def release(self, claims: Sequence[Claim]) -> None:
        """Give claims back to the ready index (publishing failed): no run, no penalty."""
        metrics.released(claims)
        pipe = self.redis.pipeline(transaction=False)
        for c in claims:
            run_script(
                pipe,
                "release",
                keys=[
                    self.keys.job(c.job_id),
                    self.keys.leases(c.region, c.lane),
                    self.keys.ready(c.region, c.lane),
                ],
                args=[c.lease_token, c.job_id],
            )
        pipe.execute()

    # --- expired leases -----------------------------------------------------------------------
    def reap(self, now_s: float) -> int:
        """Finish every expired lease as a timed-out, lost run; the count actually reaped."""
        pipe = self.redis.pipeline(transaction=False)
        lanes = [(r, lane) for r in self.regions for lane in (LANE_FAST, LANE_SLOW)]
        for region, lane in lanes:
            pipe.zrangebyscore(self.keys.leases(region, lane), "-inf", repr(now_s))
        expired = [job for jobs in pipe.execute() for job in jobs]
        if not expired:
            return 0
        now = from_unix(now_s)
        ceiling_ms = self.params.effective_check_timeout().total_seconds() * 1000
        runs: list[CompletedRun] = []
        orphans: list[str] = []
        pipe = self.redis.pipeline(transaction=False)
        for job_id in expired:
            pipe.hgetall(self.keys.job(job_id))
        for job_id, h in zip(expired, pipe.execute(), strict=True):
            try:
                job = JobState.from_hash(job_id, h) if h else None
                if job is None or job.lease_token is None:
                    orphans.append(job_id)
                    continue
                if job.lease_expiry is None or job.lease_expiry > now_s:
                    continue  # completed and claimed again since we looked: a live lease
                next_at = job.next_scheduled_at(now)
                state = self.params.post_exec(
                    job.post_exec_input(
                        duration_ms=ceiling_ms,
                        timed_out=True,
                        exec_start=None,
                        next_scheduled_at=next_at,
                    )
                )
                record = RunRecord.lost(
                    job_id, lane=job.lane, scheduled_at=job.scheduled_at, now=now_s
                )
                health = plan_health(self.redis, self.keys, self.settings, job, now, State.DOWN)
            except DATA_ERRORS as exc:  # this job's numbers: set it aside, reap the others
                quarantine(self.redis, self.keys, job_id, QuarantineStep.REAP, exc, now_s)
                continue
            if health.maintenance_until is not None:
                record = record.in_maintenance()
            passed = job.ticks_passed(next_at)
            runs.append(
                CompletedRun(job_id, job.lease_token, state, next_at, record, health, passed)
            )
        if orphans:
            # Leases of jobs that no longer exist (a delete raced the claim): just drop them.
            pipe = self.redis.pipeline(transaction=False)
            for region, lane in lanes:
                pipe.zrem(self.keys.leases(region, lane), *orphans)
            pipe.execute()
        done = complete_runs_each(
            self.redis, self.keys, runs, results_maxlen=self.settings.results_history
        )
        errors = [x if isinstance(x, Exception) else None for x in done]
        if not failing_alone(errors):
            raise next(e for e in errors if e is not None)
        for run, reply in zip(runs, done, strict=True):
            if isinstance(reply, Exception):
                quarantine(self.redis, self.keys, run.job_id, QuarantineStep.REAP, reply, now_s)
        written = [not isinstance(reply, Exception) and reply[0] for reply in done]
        metrics.reaped(runs, written)
        return sum(written)


def _message(build: Any, c: Claim) -> TaskMessage:
    return build(
        job_id=c.job_id,
        region=c.region,
        lane=c.lane,
        lease_token=c.lease_token,
        scheduled_at=c.scheduled_at,
        effective_scheduled_at=c.effective_scheduled_at,
        cost_ewma_ms=c.cost_ewma_ms,
    )


def _slots_left(claimed: ClaimResult) -> bool:
    """Whether a claim left a region with free slots: nothing claimable was waiting there."""
    taken: dict[str, int] = {}
    for c in claimed.claims:
        taken[c.region] = taken.get(c.region, 0) + 1
    return any(slots.free > taken.get(region, 0) for region, slots in claimed.slots.items())


_refillers: weakref.WeakKeyDictionary[Celery, dict[int, Dispatcher]] = weakref.WeakKeyDictionary()
_refill_lock = threading.Lock()
_inherited_refillers: list[Dispatcher] = []


def _forget_refillers_in_child() -> None:
    """A prefork child builds its own refill dispatcher: the parent's (built by the warm-up)
    holds the parent's Redis and broker pools, whose locks a parent thread may have held at
    the fork (see ``celery_app.redis.client``). Kept, never closed, for the same reason."""
    global _refill_lock
    _refill_lock = threading.Lock()
    _inherited_refillers.extend(d for each in _refillers.values() for d in each.values())
    _refillers.clear()


os.register_at_fork(after_in_child=_forget_refillers_in_child)


def _refiller(app: Celery, partition: int = 0) -> Dispatcher:
    """The app's refill dispatcher of ``partition``; every partition's shares the publisher of
    the first one built."""
    with _refill_lock:
        of_app = _refillers.get(app)
        if of_app is None:
            of_app = _refillers[app] = {}
        dispatcher = of_app.get(partition)
        if dispatcher is None:
            shared = next(iter(of_app.values()), None)
            dispatcher = of_app[partition] = Dispatcher(
                app,
                partition=partition,
                publisher=shared.publisher if shared is not None else None,
            )
    return dispatcher


def warm_refill(app: Celery) -> None:
    """Build the refill dispatchers and their publisher (the run task's route resolved)
    before the first run needs them (``workers.warmup``)."""
    first = _refiller(app)
    publisher = cast(BatchPublisher, first.publisher)  # make_publisher built it
    publisher.prepare([RUN_CHECK_TASK])
    for partition in range(1, first.keys.partitions):
        _refiller(app, partition)


class RefillNeeds:
    """The reads that tell a refill of ``region`` whether it may find anything (the server's
    time, the first due job, whether the region has ready or held work), one script call
    (``refill_needs.lua``) queued on any pipeline: the post-exec write's own round trip carries
    it (``prefetch`` / ``prefetched``, as :class:`~celery_app.checks.check_state.HealthPlanner`'s),
    so the refill after a run under spare capacity costs no round trip of its own. Read before
    the run's write: the write only frees a slot and adds the job's next tick (a period ahead),
    and an older ``now`` only makes the claim's cut-off earlier, never a start early."""

    READS = 1

    def __init__(self, keys: Keys, region: str) -> None:
        self.keys, self.region = keys, region
        self.replies: list[Any] | None = None

    def prefetch(self, pipe: Any) -> None:
        k, region = self.keys, self.region
        run_script(
            pipe,
            "refill_needs",
            [k.due(), k.ready(region, LANE_FAST), k.ready(region, LANE_SLOW),
             k.held_tenants(region)],
        )  # fmt: skip

    def prefetched(self, replies: list[Any]) -> None:
        self.replies = list(replies[: self.READS])

    def decide(self) -> tuple[float, bool]:
        """(Redis time, whether work waits now: a job due, or ready or held work) from the
        replies. Work due only within the lead is beat's (see :meth:`Dispatcher.refill`)."""
        if self.replies is None:
            raise RuntimeError("RefillNeeds.decide before its replies were read")
        time_reply, first, waiting = self.replies[0]
        now_s = from_time_reply(time_reply)
        return now_s, bool(waiting) or (bool(first) and float(first[1]) <= now_s)


def publish_claims(app: Celery, claims: Sequence[Claim]) -> int:
    """Publish the runs of ``claims`` made outside a dispatcher (a completion's hand-off), with
    the app's one reused dispatcher: a claim whose message cannot be built is quarantined,
    one whose publish fails is released (:meth:`Dispatcher.publish`). The claims are of one
    partition (one completion's)."""
    if not claims:
        return 0
    keys = _refiller(app).keys
    return _refiller(app, keys.of_job(claims[0].job_id).partition).publish(claims)


def refill_after_run(
    app: Celery,
    region: str,
    now: float | datetime | None = None,
    needs: RefillNeeds | None = None,
    partition: int = 0,
) -> int:
    """Claim and publish work for the slot a finished run just freed in ``region``.

    Call it after a run's write was made (``workers.post_exec``). It is the same atomic claim the
    beat dispatcher makes, so it never exceeds the free slots; errors are the caller's to log
    (the next beat tick claims anyway). One Dispatcher (and publisher) per app is reused.
    ``now`` None: Redis's time, not this worker's clock, which may be ahead of the others.
    ``needs``: its reads done already (:class:`RefillNeeds`, with the run's write).
    ``partition``: the finished run's (the slot it freed is that partition's share).
    """
    return len(_refiller(app, partition).refill(region, now, needs))
