"""Cron windows exactly once under faults: a beat killed between claim and publish, a 1 h beat
stall, a clock stepped +1 h and back, a redelivered cron message.

Real beats and workers (``fault_procs.Processes``) on the test clock (``CHECKBEAT_TEST_CLOCK``)
where a process can show the fault; the clock step runs in-process engines, since a real beat's
clock cannot be stepped from outside (see :mod:`support.clock_steps`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from fault_procs import Processes, ahead_clock, clocked_env
from support.clock_steps import run_stepped
from support.cron import T0, sends
from support.partitions import suite_keys
from support.polling import wait_for
from support.run_witness import run_counts

from celery_app.cron_tasks.cron_state import FireRequest, parse_window_id
from celery_app.cron_tasks.firing import TEST_PAUSE_AFTER_CLAIM_ENV
from celery_app.cron_tasks.registration import (
    GLOBAL_TENANT,
    cron,
    cron_tasks,
    window_id,
    window_start,
)
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.factory import settings_of
from celery_app.redis.schema import CronGapField, CronStateField, CronStatsField
from celery_app.wall_clock import Clock

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

KEYS = suite_keys("cbtest")
MIN = timedelta(minutes=1)
TENANTS = ["t0", "t1"]

TASKS = """
import os
from celery_app import cron
from support.run_witness import witnessed


SINGLETON = os.environ.get("FAULT_SINGLETON", "1") == "1"
for i in range(3):
    cron("* * * * *", id=f"s{i}", name=f"faults.s{i}", bind=True, singleton=SINGLETON)(
        witnessed(f"s{i}")
    )
cron("*/5 * * * *", id="five", name="faults.five", bind=True, singleton=SINGLETON)(
    witnessed("five")
)
cron("* * * * *", id="fan", name="faults.fan", per_tenant=True, bind=True, singleton=SINGLETON)(
    witnessed("fan")
)
"""


def _procs(tmp_path, rate: float, grace_s: int, **env: str) -> tuple[Processes, Clock]:
    clock = ahead_clock(rate)
    env = clocked_env(
        tmp_path, clock, "fault_once_tasks", TASKS, CHECKBEAT_CRON_GRACE=str(grace_s), **env
    )
    return Processes(tmp_path, env), clock


def _noop() -> None: ...


def test_beat_killed_between_claim_and_publish_loses_nothing(tmp_path, r, broker_url, fault_report):
    redis.Redis.from_url(broker_url).flushdb()
    r.sadd(KEYS.tenants(), *TENANTS)
    marker = tmp_path / "claimed"
    procs, clock = _procs(tmp_path, rate=30.0, grace_s=600)
    try:
        procs.worker("-P", "threads", "-c", "8", "-Q", "celery")
        doomed = procs.beat(**{TEST_PAUSE_AFTER_CLAIM_ENV: str(marker)})
        wait_for(marker.exists, 30, what="the doomed beat to claim its first windows")
        (record,) = [json.loads(raw) for raw in r.hvals(KEYS.cron_pending())]
        claimed = [tuple(m.split("|")) for m in record["members"]]
        doomed.kill()  # SIGKILL: window keys taken, nothing published
        killed_at = time.monotonic()
        assert sends(broker_url) == {}
        procs.beat()
        wait_for(
            lambda: all(run_counts(r)[key] for key in claimed),
            45,
            what="the survivor to take over and the worker to run the claimed windows",
        )
        recovery = time.monotonic() - killed_at
        # The survivor keeps firing: judge two more windows of the minutely tasks too.
        after = window_start(clock.now()) + MIN
        later = [
            (task, tenant, window_id(after + k * MIN))
            for k in range(2)
            for task, tenant in [(f"s{i}", GLOBAL_TENANT) for i in range(3)]
            + [("fan", t) for t in TENANTS]
        ]
        wait_for(
            lambda: all(run_counts(r)[key] for key in later),
            45,
            what="two later windows",
        )
        wait_for(
            lambda: not list(r.scan_iter(KEYS.cron_inflight("*", "*"))), 30, what="runs to end"
        )
    finally:
        procs.stop_all()
    counts = run_counts(r)
    judged = claimed + later
    duplicates = {key: n for key, n in counts.items() if n > 1}
    missed = [key for key in judged if counts[key] == 0]
    never_published = [
        g for g in map(json.loads, r.lrange(KEYS.cron_gaps(), 0, -1)) if "never" in g["detector"]
    ]
    taken_over = sum(
        int(r.hget(KEYS.cron_stats(task), CronStatsField.TAKEN_OVER) or 0)
        for task in ("s0", "s1", "s2", "five", "fan")
    )
    fault_report.add(
        "beat killed between claim and publish",
        runs=len(judged),
        duplicates=sum(n - 1 for n in duplicates.values()),
        misses=len(missed),
        max_recovery_s=recovery,
        claimed_by_the_killed_beat=len(claimed),
        taken_over=taken_over,
    )
    assert claimed, "the doomed beat claimed nothing"
    assert not duplicates, duplicates
    assert not missed, missed
    assert taken_over == len(claimed)
    assert never_published == []
    assert r.hlen(KEYS.cron_pending()) == 0


def _fire_windows(spec_minutes: int, first: datetime, last: datetime) -> list[datetime]:
    out, at = [], first
    while at <= last:
        if at.minute % spec_minutes == 0:
            out.append(at)
        at += MIN
    return out


def test_one_hour_beat_stall_reports_every_missed_window(tmp_path, r, broker_url, fault_report):
    """SIGSTOP a beat for one simulated hour: every window it did not fire is in a gap range."""
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    r.sadd(KEYS.tenants(), *TENANTS)
    rate = 600.0  # one hour = 6 real seconds
    # Non-singletons and no worker: each window's messages wait in the broker, to be counted.
    procs, clock = _procs(tmp_path, rate=rate, grace_s=60, FAULT_SINGLETON="0")
    try:
        beat = procs.beat()
        wait_for(lambda: len(sends(broker_url)) >= 20, 30, what="the beat to fire a few windows")
        os.kill(beat.pid, signal.SIGSTOP)
        stalled_from = clock.now()
        wait_for(lambda: clock.now() > stalled_from + timedelta(hours=1), 20, what="one hour")
        os.kill(beat.pid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_for(
            lambda: any(
                json.loads(g)[CronGapField.TASK] == "s0" for g in r.lrange(KEYS.cron_gaps(), 0, -1)
            ),
            20,
            what="the resumed beat to record the gap",
        )
        recovery = time.monotonic() - resumed
        resumed_at = clock.now()
        wait_for(
            lambda: clock.now() > resumed_at + 5 * MIN, 20, what="five windows after the stall"
        )
    finally:
        procs.stop_all()
    counts = sends(broker_url)
    gaps = [json.loads(g) for g in r.lrange(KEYS.cron_gaps(), 0, -1)]
    sent_windows = sorted(parse_window_id(w) for (_t, _n, w) in counts)
    first, last = sent_windows[0], sent_windows[-1]
    judged, missed, covered_by_gaps = 0, [], 0
    pairs = [(f"s{i}", GLOBAL_TENANT, 1) for i in range(3)] + [("five", GLOBAL_TENANT, 5)]
    pairs += [("fan", t, 1) for t in TENANTS]
    for task, tenant, every in pairs:
        ranges = [
            (g[CronGapField.FROM], g[CronGapField.TO])
            for g in gaps
            if g[CronGapField.TASK] == task and g.get(CronGapField.TENANT, GLOBAL_TENANT) == tenant
        ]
        for window in _fire_windows(every, first, last):
            judged += 1
            ts = window.timestamp()
            if counts[(task, tenant, window_id(window))]:
                continue
            if any(lo <= ts < hi for lo, hi in ranges):
                covered_by_gaps += 1
            else:
                missed.append((task, tenant, window_id(window)))
    duplicates = {key: n for key, n in counts.items() if n > 1}
    s0_gaps = [g for g in gaps if g[CronGapField.TASK] == "s0"]
    fault_report.add(
        "1 h beat stall",
        runs=judged - covered_by_gaps - len(missed),
        duplicates=sum(n - 1 for n in duplicates.values()),
        misses=len(missed),
        max_recovery_s=recovery,
        windows_reported_as_gaps=covered_by_gaps,
        gap_records=len(gaps),
    )
    assert not missed, f"neither fired nor reported: {missed[:10]}"
    assert not duplicates, duplicates
    assert covered_by_gaps >= 55 * 5  # about an hour of the four minutely pairs, and more
    # The stall is one range per pair, with its count: not one record per window.
    assert max(g.get(CronGapField.COUNT, 1) for g in s0_gaps) >= 55
    assert len(gaps) <= 6 * 3  # a few ranges per pair (a loaded machine may add a short one)


def test_clock_stepped_one_hour_and_back_fires_nothing_early_nothing_twice(
    cron_app, broker_url, r, fault_report
):
    cron("* * * * *", app=cron_app, id="minutely", name="step.minutely")(_noop)
    cron("0 * * * *", app=cron_app, id="hourly", name="step.hourly")(_noop)
    hour = timedelta(hours=1)

    def step(elapsed: timedelta) -> timedelta:  # +1 h from 00:10 to 00:40, then back
        return hour if 10 * MIN <= elapsed < 40 * MIN else timedelta(0)

    started = time.monotonic()
    fired = run_stepped(cron_app, r, 75 * MIN, step)
    elapsed_s = time.monotonic() - started
    early = [(at, w) for runs in fired.values() for at, w in runs if w > at]
    counts = sends(broker_url)
    expected = [("minutely", GLOBAL_TENANT, window_id(T0 + k * MIN)) for k in range(75)]
    expected += [("hourly", GLOBAL_TENANT, window_id(T0 + k * hour)) for k in range(2)]
    missed = [key for key in expected if counts[key] == 0]
    duplicates = {key: n for key, n in counts.items() if n > 1}
    fault_report.add(
        "clock stepped +1 h and back",
        runs=sum(counts.values()),
        duplicates=sum(n - 1 for n in duplicates.values()),
        misses=len(missed),
        max_recovery_s=None,
        early=len(early),
        simulated_minutes=75,
        real_s=round(elapsed_s, 2),
        engines="in-process, explicit wall + steady clocks",
    )
    assert early == []
    assert not duplicates, duplicates
    assert not missed, missed


def test_redelivered_cron_message_is_suppressed_and_recorded(
    tmp_path, cron_app, r, broker_url, fault_report
):
    """The same window delivered twice (a takeover after a slow publish, a broker redelivery)
    to a real worker process runs once; the second delivery is counted as suppressed."""
    redis.Redis.from_url(broker_url).flushdb()
    procs, _clock = _procs(tmp_path, rate=1.0, grace_s=600)
    cron("* * * * *", app=cron_app, id="s0", name="faults.s0")(_noop)
    window = window_start(datetime.now(UTC))
    req = FireRequest(cron_tasks(cron_app)["s0"], GLOBAL_TENANT, window)
    publisher = CronPublisher(cron_app, settings_of(cron_app).cron_grace)
    try:
        procs.worker("-P", "threads", "-c", "4", "-Q", "celery")
        publisher.publish([req, req])  # both deliveries wait in the broker, side by side
        sent_at = time.monotonic()
        state_key = KEYS.cron_state("s0", GLOBAL_TENANT)
        wait_for(
            lambda: (
                r.hget(state_key, CronStateField.SUPPRESSED) == "1"
                and r.hget(state_key, CronStateField.OUTCOME) == "success"
            ),
            45,
            what="one run and one suppressed delivery",
        )
        recovery = time.monotonic() - sent_at
        worker_log = procs.started[0].output()
    finally:
        publisher.close()
        procs.stop_all()
    counts = run_counts(r)
    key = ("s0", GLOBAL_TENANT, window_id(window))
    suppressed = int(r.hget(KEYS.cron_stats("s0"), CronStatsField.SUPPRESSED) or 0)
    fault_report.add(
        "redelivered cron message",
        runs=counts[key],
        duplicates=max(0, counts[key] - 1),
        misses=int(counts[key] == 0),
        max_recovery_s=recovery,
        suppressed=suppressed,
    )
    assert counts == {key: 1}
    assert suppressed == 1
    assert "cron: suppressed delivery" in worker_log
