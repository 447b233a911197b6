"""Scheduling on Redis's clock: a process whose own clock is off never steps the schedule back.

"A process clock ahead/behind" is this process's ``time.time`` shifted, the wall clock a skewed
machine would read; Redis's ``TIME`` is not shifted. The multi-process version, with beat and
workers under libfaketime, is tests/faults/test_clock_skew.py.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest
from support.checks import at, learned, register_fake_worker
from support.completion import finish
from support.partitions import first_partition_names

from beat import CronScheduler
from celery_app.checks.dispatch import Dispatcher, refill_after_run
from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import lease_seconds
from celery_app.redis.clock import server_time

NOW = 1_780_000_000.0


#: Its checks live in the first partition of the check half, the one its keys and dispatcher
#: read.
U, J = first_partition_names()


@pytest.fixture
def clock_off(monkeypatch):
    """clock_off(seconds): this process's wall clock (``time.time``) runs that far off."""
    real = time.time

    def shift(seconds: float) -> None:
        monkeypatch.setattr(time, "time", lambda: real() + seconds)

    return shift


def create(store, uid: str, now: float, period: int = 60) -> str:
    """Create check ``uid`` (in the first partition, the one ``keys``, the refill and the
    dispatcher below read) and return its job in eu."""
    store.create(
        now=at(now), uid=U(uid), tenant="acme", kind="testprobe", target="x", period=period,
        regions=["eu"],
    )  # fmt: skip
    return J(uid)


def claim_by_hand(r, keys, job: str, *, tick: float, lease_expiry: float) -> None:
    """What the claim script leaves: the job out of ``due``, its tick, a lease."""
    r.zrem(keys.due(), job)
    r.hset(keys.job(job), mapping={"sa": f"{tick:.3f}", "lt": "tok", "lx": f"{lease_expiry:.3f}"})
    r.zadd(keys.leases("eu", 0), {job: lease_expiry})


def finished(r, keys, store, job: str, **kw) -> bool:
    written, _transition = finish(
        r, keys, store.settings, job, "tok", params=store.params, duration_ms=50.0, **kw
    )
    return written


@pytest.mark.parametrize("behind_s", [0.8, 2.0, 59.0])
def test_a_run_finished_on_a_clock_behind_its_tick_is_next_due_a_full_period_later(
    r, keys, store, behind_s
):
    """Before: next_aligned(now) on a clock behind the tick stored that same tick (or one 0.2 s
    after it), and the check ran again at once."""
    job = create(store, "c1", NOW)
    tick = read_job(r, keys, job).scheduled_at  # on the job's phase
    claim_by_hand(r, keys, job, tick=tick, lease_expiry=tick + 30)
    assert finished(r, keys, store, job, now=at(tick - behind_s), scheduled_at=tick)
    assert r.zscore(keys.due(), job) == pytest.approx(tick + 60, abs=0.001)


def test_a_run_finished_on_a_clock_ahead_keeps_the_next_tick(r, keys, store, clock_off):
    """Without ``now`` the next tick comes from Redis's time: a worker 61 s ahead would have
    skipped the tick due within the next minute."""
    job = create(store, "c1", NOW)
    server = server_time(r)
    next_tick = read_job(r, keys, job).next_scheduled_at(at(server)).timestamp()
    tick = next_tick - 60  # the tick just run, late: its run finishes now
    claim_by_hand(r, keys, job, tick=tick, lease_expiry=server + 30)
    clock_off(+61)
    assert finished(r, keys, store, job, scheduled_at=tick)
    # the same phase second (next_aligned carries now's sub-second part over)
    assert math.floor(r.zscore(keys.due(), job)) == math.floor(next_tick)


def test_a_refill_on_a_clock_ahead_promotes_nothing_before_its_tick(
    r, keys, store, dispatcher_app, broker, clock_off
):
    """Before: the worker's refill promoted with its own clock, so one 10 s ahead claimed work
    10 s early, and wrote a lease expiry 10 s late."""
    later, due = create(store, "later", NOW), create(store, "due", NOW)
    server = server_time(r)
    learned(r, keys, store.params, later, scheduled_at=server + 5)
    learned(r, keys, store.params, due, scheduled_at=server - 0.1)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2)
    clock_off(+10)
    assert refill_after_run(dispatcher_app, "eu") == 1
    assert r.zrange(keys.leases("eu", 0), 0, -1) == [due]
    assert r.zscore(keys.due(), later) == pytest.approx(server + 5, abs=0.001)
    lease_s = lease_seconds(store.params, dispatcher_app.conf.checkbeat_settings.lease_margin)
    assert read_job(r, keys, due).lease_expiry == pytest.approx(server + lease_s, abs=0.5)


def test_a_tick_on_a_clock_ahead_reaps_no_live_lease(
    r, keys, store, dispatcher_app, broker, clock_off
):
    job = create(store, "c1", NOW)
    server = server_time(r)
    claim_by_hand(r, keys, job, tick=server - 1, lease_expiry=server + 3)
    clock_off(+10)
    dispatcher = Dispatcher(dispatcher_app, client=r)
    assert dispatcher.tick().reaped == 0
    assert read_job(r, keys, job).lease_token == "tok"
    assert dispatcher.tick(server + 4).reaped == 1  # an explicit now (tests) still rules


def test_beat_dispatches_on_redis_time_not_on_its_own_clock(r, keys, store, dispatcher_app, broker):
    """Beat's clock drives the cron engine (here a test clock in 2030); the dispatcher it runs
    reads Redis's time, so a job due in 30 s is not claimed yet and a due one is."""
    later, due = create(store, "later", NOW), create(store, "due", NOW)
    server = server_time(r)
    learned(r, keys, store.params, later, scheduled_at=server + 30)
    learned(r, keys, store.params, due, scheduled_at=server - 0.1)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2)
    sched = CronScheduler(app=dispatcher_app, clock=lambda: datetime(2030, 1, 1, tzinfo=UTC))
    try:
        sched.tick()
    finally:
        sched.close()
    assert r.zrange(keys.leases("eu", 0), 0, -1) == [due]
    assert r.zscore(keys.due(), later) == pytest.approx(server + 30, abs=0.001)
