"""A beat blocked past the grace is a stall, not a clock step: every window it slept through is
fired while its grace lasts or recorded as a gap, none early, none late, none lost.

The stall is injected between the engine's wall read and its steady read (a beat blocked in a
Redis call after reading the time, or SIGSTOPped there): read that way, the wall clock of the
next tick looks a stall's length ahead of the steady clock, which the engine once held as a
forward clock step (tests/faults/test_sentinel_failover.py found it).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from support.cron import T0, end_runs, found, make_engine, recording_worker, store_of

from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.findings import Finding, FindingKind
from celery_app.redis.schema import CronGapField, CronOutcome
from celery_app.wall_clock import Clock
from scheduling_core.clock_step import Reading, StepVerdict, judge, pairs, wall_lead

MIN = timedelta(minutes=1)
TICK = timedelta(seconds=10)
STEP_LOG = "firing by the steady clock"


class StalledClocks:
    """True time; the engine's wall and steady clocks follow it. ``stall_after_wall_read``
    makes the next wall read return, then true time jump (both clocks advance)."""

    def __init__(self) -> None:
        self.true = T0
        self._stall = timedelta(0)

    def stall_after_wall_read(self, length: timedelta) -> None:
        self._stall = length

    def wall(self) -> datetime:
        now = self.true
        self.true, self._stall = self.true + self._stall, timedelta(0)
        return now

    def steady(self) -> float:
        return 5000.0 + (self.true - T0).total_seconds()


def _noop() -> None: ...


def test_stall_of_three_graces_records_every_expired_window_fires_none_early_or_late(
    cron_app, r, caplog
):
    cron("* * * * *", app=cron_app, id="minutely", name="stall.minutely")(_noop)
    engine = make_engine(cron_app)
    clocks = StalledClocks()
    engine.clock, engine.steady = clocks.wall, clocks.steady
    grace = engine.grace
    stall = 3 * grace
    stall_at = T0 + 5 * MIN + timedelta(seconds=1)
    fired: list[tuple[datetime, datetime]] = []  # (true time after the tick, window)
    caplog.set_level(logging.WARNING, logger="beat.cron_engine")
    clocks.true = T0 + timedelta(seconds=1)
    end = T0 + 20 * MIN
    while clocks.true < end:
        if clocks.true == stall_at:
            clocks.stall_after_wall_read(stall)
        report = engine.tick()
        fired += [(clocks.true, f.window) for f in report.fired]
        end_runs(r)
        clocks.true += TICK
    assert STEP_LOG not in caplog.text  # a stall is no clock step
    assert engine.trusted(clocks.true, clocks.steady()) == clocks.true
    early = [(at, w) for at, w in fired if w > at]
    late = [(at, w) for at, w in fired if at >= w + MIN + grace]
    assert early == [] and late == []
    gaps = store_of(cron_app).gaps()
    ranges = [(g[CronGapField.FROM], g[CronGapField.TO]) for g in gaps]
    windows = [T0 + k * MIN for k in range(20)]
    sent = [w for _, w in fired]
    in_gap = [w for w in windows if any(lo <= w.timestamp() < hi for lo, hi in ranges)]
    assert sorted(set(sent)) == sorted(sent)  # none twice
    assert set(sent) & set(in_gap) == set()  # a fired window is no gap
    assert sorted(set(sent) | set(in_gap)) == windows  # none lost
    # 00:05 and 00:06 expired in the stall (00:08:01), 00:07 was superseded by 00:08.
    assert in_gap == [T0 + 5 * MIN, T0 + 6 * MIN, T0 + 7 * MIN]
    (gap,) = gaps
    assert gap[CronGapField.COUNT] == 3


def test_stall_after_reading_the_time_is_no_step_when_the_caller_pairs_the_clocks(cron_app, r):
    """A caller giving ``at`` gives the steady time read with it: a stall after both reads
    moves neither, and the next tick's clocks are in step."""
    cron("* * * * *", app=cron_app, id="minutely", name="stall.paired")(_noop)
    engine = make_engine(cron_app)
    clocks = StalledClocks()
    engine.steady = clocks.steady
    clocks.true = T0 + timedelta(seconds=1)
    engine.tick(clocks.true, clocks.steady())
    end_runs(r)
    at, steady = clocks.true + TICK, clocks.steady() + TICK.total_seconds()
    clocks.true += TICK + 3 * engine.grace  # blocked after the reads, before the tick
    engine.tick(at, steady)
    end_runs(r)
    report = engine.tick(clocks.true, clocks.steady())
    assert report.at == clocks.true  # not held as a step


def test_a_real_forward_step_is_still_held():
    """The pure rule: the wall ahead of the steady clock by more than the tolerance is held,
    then accepted after the hold; a stall (both advance) is in step."""
    anchor = Reading(wall=1000.0, steady=50.0)
    stall = Reading(wall=1000.0 + 180, steady=50.0 + 180)
    step = Reading(wall=1000.0 + 10 + 3600, steady=50.0 + 10)
    assert wall_lead(anchor, stall) == 0.0
    assert judge(wall_lead(anchor, stall), 60.0, None, 7200.0) is StepVerdict.IN_STEP
    assert wall_lead(anchor, step) == 3600.0
    assert judge(3600.0, 60.0, None, 7200.0) is StepVerdict.HOLD
    assert judge(3600.0, 60.0, 7199.0, 7200.0) is StepVerdict.HOLD
    assert judge(3600.0, 60.0, 7200.0, 7200.0) is StepVerdict.ACCEPT
    assert judge(-3600.0, 60.0, None, 7200.0) is StepVerdict.IN_STEP  # a step back: followed


@pytest.mark.parametrize(
    ("before", "after", "paired"), [(10.0, 10.0, True), (10.0, 10.4, True), (10.0, 190.0, False)]
)
def test_a_wall_read_pairs_with_steady_reads_only_when_no_stall_came_between(before, after, paired):
    assert pairs(before, after) is paired


def test_test_clock_steady_runs_at_the_clock_rate():
    """Beat compares the test clock with ``Clock.steady``: both must advance at one rate, or a
    test clock at 60x would look like a clock stepping forward every tick."""
    clock = Clock(T0, 0.0, 60.0)
    wall0, steady0 = clock.now(), clock.steady()
    for _ in range(200_000):  # let some real time pass (no sleep needed)
        pass
    wall1, steady1 = clock.now(), clock.steady()
    assert steady1 > steady0
    lead = (wall1 - wall0).total_seconds() - (steady1 - steady0)
    assert abs(lead) < 0.5


def test_a_window_skipped_behind_a_run_in_flight_is_named_by_diagnose(cron_app, r):
    """A window the overlap policy skipped is not fired either: diagnose names it (after a
    stall, the late run of one window may still wait for its worker when the next is due)."""
    recording_worker(r)  # a live worker records runs (these tests write or lose them)
    cron("* * * * *", app=cron_app, id="minutely", name="stall.inflight")(_noop)
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired  # 00:00; its run never ends
    report = engine.tick(T0 + MIN + timedelta(seconds=1))
    assert [s.reason for s in report.skipped] == ["in-flight"]
    findings = CronService(cron_app, clock=lambda: T0 + 2 * MIN).diagnose()
    skips = [f for f in findings if f.kind == FindingKind.SKIPPED]
    assert found(skips) == {(FindingKind.SKIPPED, "minutely", T0 + MIN)}
    assert [f.message for f in skips] == [
        f"task 'minutely': window {window_id(T0 + MIN)} was skipped, not fired: the previous run "
        "was still in flight (1 skipped in all)"
    ]


def _unstarted(app, now: datetime) -> list[Finding]:
    findings = CronService(app, clock=lambda: now).diagnose()
    return [f for f in findings if f.kind == FindingKind.NEVER_STARTED]


def test_a_fired_window_no_worker_started_is_named_once_its_deadline_passed(cron_app, r):
    """A window whose message was lost after it fired (a broker failover before replication)
    is never sent again (its window key says fired): diagnose names it instead."""
    recording_worker(r)  # a live worker records runs (these tests write or lose them)
    cron("* * * * *", app=cron_app, id="lost", name="stall.lost")(_noop)
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired  # 00:00 fired ...
    r.delete("celery")  # ... and its message lost with the broker (the default queue)
    deadline = T0 + MIN + engine.grace
    assert _unstarted(cron_app, deadline) == []  # a worker may still take it until then
    (lost,) = _unstarted(cron_app, deadline + timedelta(seconds=1))
    assert (lost.subject, lost.since) == ("lost", T0)
    assert [lost.message] == [
        f"task 'lost': window {window_id(T0)} was fired but never started by its deadline "
        f"{deadline.isoformat(timespec='seconds')}: no worker ever received its message "
        "(lost with the broker?)"
    ]


def test_a_lost_minutely_run_is_named_although_later_windows_moved_on(cron_app, r):
    """A singleton's lost run keeps its in-flight key: the next windows are skipped behind it
    before its deadline passes, and diagnose still names the window that was lost."""
    recording_worker(r)  # a live worker records runs (these tests write or lose them)
    cron("* * * * *", app=cron_app, id="minutely-lost", name="stall.minutely_lost")(_noop)
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired
    r.delete("celery")
    assert [s.reason for s in engine.tick(T0 + MIN + timedelta(seconds=1)).skipped] == ["in-flight"]
    (finding,) = _unstarted(cron_app, T0 + MIN + engine.grace + timedelta(seconds=1))
    assert (finding.subject, finding.since) == ("minutely-lost", T0)
    assert f"window {window_id(T0)} was fired but never started" in finding.message


def test_a_started_or_expired_window_is_reported_as_what_it_was(cron_app, r):
    recording_worker(r)  # a live worker records runs (these tests write or lose them)
    cron("* * * * *", app=cron_app, id="ran", name="stall.ran")(_noop)
    cron("* * * * *", app=cron_app, id="expired", name="stall.expired")(_noop)
    engine = make_engine(cron_app)
    assert len(engine.tick(T0 + timedelta(seconds=1)).fired) == 2
    store = store_of(cron_app)
    wid = window_id(T0)
    assert store.run_started("ran", GLOBAL_TENANT, wid, False, T0 + timedelta(seconds=2)) is None
    expired = f"message expired before it ran (window {wid})"  # as task_revoked records it
    store.run_finished("expired", GLOBAL_TENANT, wid, CronOutcome.EXPIRED, expired, T0 + 2 * MIN)
    (finding,) = _unstarted(cron_app, T0 + 3 * MIN)
    assert (finding.subject, finding.since) == ("expired", T0)
    assert finding.message.endswith("its message expired before a worker took it")
