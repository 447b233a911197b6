"""beat.CronScheduler: the Celery Scheduler shell around the cron engine and the drivers."""

from __future__ import annotations

import gc
import os
import signal
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.cron import SEEN, T0, end_runs, seen_since, sends

import beat.scheduler as scheduler_module
from beat import CronScheduler
from beat.scheduler import finish_tick_before_stopping
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.factory import create_app
from celery_app.findings import FindingKind
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.schema import Keys
from celery_app.settings import load_settings

MIN = timedelta(minutes=1)


class FakeClock:
    def __init__(self, at):
        self.at = at

    def __call__(self):
        return self.at


class CountingDriver:
    """A driver reads its own clock (the dispatcher: Redis's); beat passes it none."""

    interval = 0.5

    def __init__(self):
        self.ticks = 0

    def tick(self):
        self.ticks += 1


def _noop(): ...


def test_scheduler_fires_windows_heartbeats_runs_drivers_and_sleeps_to_next(
    cron_app, broker_url, r, monkeypatch
):
    assert cron_app.conf.beat_scheduler == "beat:CronScheduler"
    cron("*/2 * * * *", app=cron_app, id="every-2", name="s.every2")(_noop)
    driver = CountingDriver()
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [driver])
    seen_since(cron_app, SEEN)  # deployed before: the window in progress is caught up
    clock = FakeClock(T0 + timedelta(seconds=1))
    sched = CronScheduler(app=cron_app, clock=clock, max_interval=300)
    sleep = sched.tick()
    assert sends(broker_url)[("every-2", GLOBAL_TENANT, window_id(T0))] == 1
    assert driver.ticks == 1
    assert 0 < sleep <= driver.interval  # the driver is due before the next window
    assert sched.beat_id in r.hgetall(Keys("cbtest").beat_heartbeat())
    clock.at = T0 + 2 * MIN + timedelta(seconds=1)
    end_runs(r)
    sched.drivers[0].due = 0  # the driver's interval passed too
    sched.tick()
    assert sends(broker_url)[("every-2", GLOBAL_TENANT, window_id(T0 + 2 * MIN))] == 1
    assert driver.ticks == 2
    # Without drivers, sleep until the next window (2 min away), capped by the heartbeat.
    sched.drivers = []
    clock.at = T0 + 3 * MIN
    assert sched.tick() == pytest.approx(min(60, sched.heartbeat_every))
    sched.close()
    assert sched.beat_id not in r.hgetall(Keys("cbtest").beat_heartbeat())
    # the clean stop is kept: diagnose names it instead of "no heartbeat ever recorded"
    assert float(r.hget(Keys("cbtest").cron_beats_stopped(), sched.beat_id)) == clock.at.timestamp()
    diagnosed = CronService(cron_app).diagnose()
    (finding,) = [f for f in diagnosed if f.kind == FindingKind.NO_LIVE_BEAT]
    assert (finding.subject, finding.since) == (sched.beat_id, clock.at)
    assert f"the last beat ({sched.beat_id}) stopped at {clock.at.isoformat()}" in finding.message


class SlowDriver:
    """A dispatcher-like driver whose tick takes 30 ms (of a fake monotonic clock) and asks to
    run again 100 ms after it read its clock."""

    interval = 0.5

    def __init__(self, clock):
        self.clock = clock
        self.started = []

    def tick(self):
        self.started.append(self.clock[0])
        self.clock[0] += 0.030

    def next_wait(self, report):
        return 0.100


def test_a_drivers_wait_counts_from_its_tick_start_so_slow_ticks_do_not_wake_late(
    cron_app, monkeypatch
):
    mono = [1000.0]
    fake_time = SimpleNamespace(monotonic=lambda: mono[0], perf_counter=time.perf_counter)
    monkeypatch.setattr(scheduler_module, "time", fake_time)
    driver = SlowDriver(mono)
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [driver])
    sched = CronScheduler(app=cron_app, clock=FakeClock(T0 + timedelta(seconds=1)))
    sched.tick()
    assert driver.started == [1000.0]
    # due 100 ms after the tick's start (1000.100), not after its end (1000.130)
    assert sched.drivers[0].due == pytest.approx(1000.100)
    assert sched.tick() == pytest.approx(0.070)  # 30 ms of the 100 went to the tick itself
    mono[0] = 1000.100
    sched.tick()
    assert driver.started == [1000.0, 1000.100]
    sched.close()


def test_scheduler_survives_redis_outage_and_fires_after(broker_url):
    tmp = tempfile.mkdtemp(prefix="checkbeat-outage-")
    server = RedisServer(Path(tmp)).start()
    try:
        app = create_app(load_settings(redis_url=server.url(1), broker_url=broker_url))
        cron("* * * * *", app=app, id="resilient", name="s.resilient")(_noop)
        import redis as redis_lib

        redis_lib.Redis.from_url(broker_url).flushdb()
        seen_since(app, SEEN)
        clock = FakeClock(T0 + timedelta(seconds=1))
        sched = CronScheduler(app=app, clock=clock)
        sched.tick()
        assert sends(broker_url)[("resilient", GLOBAL_TENANT, window_id(T0))] == 1
        server.stop()
        clock.at = T0 + MIN + timedelta(seconds=1)
        first = sched.tick()  # Redis is down: logged, backs off, no exception
        second = sched.tick()
        assert 0 < first < second <= scheduler_module.MAX_BACKOFF
        server.start()
        redis_lib.Redis.from_url(server.url(1)).delete(
            Keys("cbtest").cron_inflight("resilient", "-")
        )
        clock.at = T0 + MIN + timedelta(seconds=50)  # still within the window's grace
        sched.tick()
        assert sends(broker_url)[("resilient", GLOBAL_TENANT, window_id(T0 + MIN))] == 1
    finally:
        server.stop()


def test_stop_signal_waits_for_the_tick_in_progress():
    def celery_like_handler(signum, frame):
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, celery_like_handler)
    finished = []
    try:
        with pytest.raises(SystemExit), finish_tick_before_stopping():
            os.kill(os.getpid(), signal.SIGTERM)
            finished.append("rest of the tick")
        assert finished == ["rest of the tick"]
        assert signal.getsignal(signal.SIGTERM) is celery_like_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_banner_counts_the_tasks_that_setup_then_loads(cron_app, monkeypatch):
    """Celery prints beat's banner before the schedule is set up: it must count the same
    tasks the log line of the setup then names, not 0."""
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [CountingDriver()])
    cron("*/2 * * * *", app=cron_app, id="every-2", name="s.banner2")(_noop)
    cron_app.conf.beat_schedule = {"ping": {"task": "s.ping", "schedule": 10.0}}
    cron_app.conf.result_expires = None
    sched = CronScheduler(app=cron_app, lazy=True)
    assert sched.engine is None  # not set up yet, as when Celery prints the banner
    assert sched.info == "    . cron tasks -> 2\n    . drivers -> 1"
    sched.setup_schedule()
    assert sched.info == "    . cron tasks -> 2\n    . drivers -> 1"
    sched.close()


def test_setup_moves_what_beat_loaded_out_of_the_collectors_sight(cron_app, monkeypatch):
    """A full collection in the middle of a window must not scan every task beat holds: once
    set up, the tasks are frozen (gc.freeze), still freed by reference counting."""
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [CountingDriver()])
    cron("*/2 * * * *", app=cron_app, id="frozen", name="s.frozen")(_noop)
    cron_app.conf.result_expires = None
    gc.unfreeze()
    sched = CronScheduler(app=cron_app, lazy=True)
    try:
        sched.setup_schedule()
        assert sched.engine is not None
        (task,) = sched.engine.tasks
        assert gc.is_tracked(task)
        assert gc.get_freeze_count() > 0
        assert not any(seen is task for seen in gc.get_objects())  # not in generations 0-2
    finally:
        sched.close()
        gc.unfreeze()


def test_the_cron_monitor_runs_only_where_the_workers_can_deliver_its_transitions(
    broker_url, redis_url, monkeypatch
):
    """A project that only set ``beat_scheduler`` has plain workers: a transition of a watched
    cron task would reach them as an unregistered task and be discarded, so beat watches
    nothing there. ``install(app)`` and checkbeat's own app have workers that deliver."""
    from celery import Celery

    from beat.cron_monitor import CronMonitor
    from celery_app.factory import install

    monkeypatch.setenv("CHECKBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("CHECKBEAT_KEY_PREFIX", "cbtest")

    def monitors(app) -> int:
        return sum(isinstance(d, CronMonitor) for d in scheduler_module.build_drivers(app))

    plain = Celery("proj", broker=broker_url, set_as_current=False)
    plain.conf.beat_scheduler = "beat:CronScheduler"
    plain.conf.imports = ["celery_app.cron_tasks.recording"]  # its workers record cron runs
    assert monitors(plain) == 0
    assert monitors(install(plain)) == 1
    assert monitors(create_app(load_settings(redis_url=redis_url, broker_url=broker_url))) == 1
