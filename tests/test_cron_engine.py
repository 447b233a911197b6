"""The cron engine against a real Redis and a real broker: exactly once per window, fan-out."""

from __future__ import annotations

import gc
import threading
from datetime import timedelta

import pytest
from support.cron import T0, end_runs, found, make_engine, sends, store_of

from celery_app.cron_tasks.registration import (
    GLOBAL_TENANT,
    cron,
    cron_tasks,
    unregister_cron,
    window_id,
)
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.findings import FindingKind
from celery_app.redis.schema import Keys

MIN = timedelta(minutes=1)


def real_skips(report):
    """Skips other than the start-up catch-up window superseded by the current one."""
    return [s for s in report.skipped if s.reason != "superseded"]


def _noop(tenant: str | None = None) -> None: ...


def _declare(app, task_id, spec="* * * * *", **options):
    return cron(spec, app=app, id=task_id, name=f"t.{task_id}", **options)(_noop)


def test_three_engines_in_threads_send_each_singleton_window_once(cron_app, broker_url, r):
    for i in range(20):
        _declare(cron_app, f"single-{i}")
    _declare(cron_app, "every-2", spec="*/2 * * * *")
    for i in range(3):
        _declare(cron_app, f"multi-{i}", singleton=False)
    _declare(cron_app, "per-tenant", per_tenant=True)
    r.sadd(Keys("cbtest").tenants(), "acme", "globex", "initech")
    engines = [make_engine(cron_app, owner=f"engine-{n}") for n in range(3)]
    windows = [T0 + k * MIN + timedelta(seconds=1) for k in range(4)]

    barrier = threading.Barrier(3, action=lambda: end_runs(r))
    errors: list[BaseException] = []

    def run(engine):
        try:
            for at in windows:
                barrier.wait(timeout=20)
                engine.tick(at)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    counts = sends(broker_url)
    wids = [window_id(T0 + k * MIN) for k in range(4)]
    for wid in wids:
        for i in range(20):
            assert counts[(f"single-{i}", GLOBAL_TENANT, wid)] == 1
        for tenant in ("acme", "globex", "initech"):
            assert counts[("per-tenant", tenant, wid)] == 1
        for i in range(3):
            assert counts[(f"multi-{i}", GLOBAL_TENANT, wid)] == 3  # every replica fires
    assert [counts[("every-2", GLOBAL_TENANT, w)] for w in wids] == [1, 0, 1, 0]
    assert sum(counts.values()) == 4 * (20 + 3 + 9) + 2


def test_per_tenant_fan_out_to_1000_tenants_follows_the_set(cron_app, broker_url, r):
    _declare(cron_app, "fanout", per_tenant=True)
    tenants = [f"tenant-{i:04d}" for i in range(1000)]
    r.sadd(Keys("cbtest").tenants(), *tenants)
    engine = make_engine(cron_app)
    report = engine.tick(T0 + timedelta(seconds=2))
    assert {f.tenant for f in report.fired} == set(tenants)
    end_runs(r)
    r.sadd(Keys("cbtest").tenants(), "newcomer")
    r.srem(Keys("cbtest").tenants(), "tenant-0000")
    engine.tick(T0 + MIN + timedelta(seconds=2))
    counts = sends(broker_url)
    first, second = window_id(T0), window_id(T0 + MIN)
    assert sum(1 for (_, _, w) in counts if w == first) == 1000
    assert counts[("fanout", "newcomer", first)] == 0
    assert counts[("fanout", "newcomer", second)] == 1
    assert counts[("fanout", "tenant-0000", second)] == 0
    assert sum(1 for (_, _, w) in counts if w == second) == 1000
    state = r.hgetall(Keys("cbtest").cron_state("fanout", "tenant-0500"))
    assert state["fired"] == "2"


def test_in_flight_singleton_is_skipped_and_recorded(cron_app, broker_url, r):
    _declare(cron_app, "slow-job")
    engine = make_engine(cron_app)
    first = engine.tick(T0 + timedelta(seconds=1))
    assert [f.task_id for f in first.fired] == ["slow-job"]
    # No worker ran it: the in-flight key is still held when the next window comes.
    second = engine.tick(T0 + MIN + timedelta(seconds=1))
    assert second.fired == ()
    assert [(s.task_id, s.reason) for s in real_skips(second)] == [("slow-job", "in-flight")]
    state = r.hgetall(Keys("cbtest").cron_state("slow-job", GLOBAL_TENANT))
    assert state["skipped"] == "1"
    assert state["last_skip_reason"] == "in-flight"
    assert sends(broker_url)[("slow-job", GLOBAL_TENANT, window_id(T0 + MIN))] == 0


def test_quiet_tick_does_no_io_and_missed_windows_catch_up_within_grace(cron_app, broker_url, r):
    _declare(cron_app, "hourly", spec="0 * * * *")
    engine = make_engine(cron_app)
    engine.tick(T0 + timedelta(seconds=1))
    engine.store = None  # a quiet tick must not touch the store at all
    assert engine.tick(T0 + 5 * MIN).fired == ()
    engine.store = store_of(cron_app)
    end_runs(r)
    # Stalled past 01:00 but within its grace (60 s after the window's end): fired late.
    late = engine.tick(T0 + 61 * MIN + timedelta(seconds=30))
    assert [f.window for f in late.fired] == [T0 + 60 * MIN]
    end_runs(r)
    # Stalled past 02:00's grace: not fired, recorded as a gap.
    missed = engine.tick(T0 + 123 * MIN)
    assert missed.fired == ()
    assert [(s.reason, s.window) for s in real_skips(missed)] == [("missed", T0 + 120 * MIN)]
    gaps = store_of(cron_app).gaps()
    assert [(g["task"], g["from"]) for g in gaps] == [("hourly", (T0 + 120 * MIN).timestamp())]


def test_publish_failure_keeps_the_window_and_is_recorded(cron_app, broker_url, r):
    _declare(cron_app, "fragile")
    engine = make_engine(cron_app)

    class BrokerDown:
        def publish(self, requests, *, manual=False):
            raise ConnectionError("broker unreachable")

    real_sender, engine.sender = engine.sender, BrokerDown()
    report = engine.tick(T0 + timedelta(seconds=1))
    assert [(s.task_id, s.reason) for s in real_skips(report)] == [("fragile", "send-failed")]
    keys = Keys("cbtest")
    state = r.hgetall(keys.cron_state("fragile", GLOBAL_TENANT))
    assert state["outcome"] == "send-failed"
    assert "broker unreachable" in state["last_error"]
    assert r.hget(keys.cron_failing(), f"fragile|{GLOBAL_TENANT}")
    assert not r.exists(keys.cron_inflight("fragile", GLOBAL_TENANT))
    # Another replica with a working broker does not fire the same window again.
    engine.sender = real_sender
    other = make_engine(cron_app, owner="engine-2")
    again = other.tick(T0 + timedelta(seconds=20))
    assert again.fired == ()
    assert [s.reason for s in real_skips(again)] == ["taken"]
    assert sends(broker_url) == {}
    # The next window fires normally.
    assert [f.task_id for f in other.tick(T0 + MIN).fired] == ["fragile"]


def test_redis_down_before_claim_leaves_the_engine_to_retry(cron_app, broker_url, r):
    _declare(cron_app, "retry-me")
    engine = make_engine(cron_app)
    engine.tick(T0 + timedelta(seconds=1))
    real_store = engine.store

    class Unreachable:
        def __getattr__(self, name):
            raise ConnectionError("redis unreachable")

    engine.store = Unreachable()
    with pytest.raises(ConnectionError):
        engine.tick(T0 + MIN + timedelta(seconds=1))
    engine.store = real_store
    r.delete(Keys("cbtest").cron_inflight("retry-me", GLOBAL_TENANT))
    report = engine.tick(T0 + MIN + timedelta(seconds=40))
    assert [f.window for f in report.fired] == [T0 + MIN]


def test_no_provider_means_per_tenant_tasks_do_not_fire(cron_app, broker_url, r, monkeypatch):
    from celery_app.factory import create_app
    from celery_app.settings import load_settings

    app = create_app(load_settings(tenants_provider="none"))
    _declare(app, "needs-tenants", per_tenant=True)
    _declare(app, "global-one")
    r.sadd(Keys("cbtest").tenants(), "acme")
    report = make_engine(app).tick(T0 + timedelta(seconds=1))
    assert [f.task_id for f in report.fired] == ["global-one"]
    assert [(s.task_id, s.reason) for s in real_skips(report)] == [("needs-tenants", "no-provider")]


def test_registered_provider_is_used(cron_app, broker_url):
    from celery_app.cron_tasks.tenants_provider import tenants_provider

    @tenants_provider(app=cron_app)
    def active():
        return ["a1", "b2"]

    _declare(cron_app, "fan", per_tenant=True)
    report = make_engine(cron_app).tick(T0 + timedelta(seconds=1))
    assert sorted(f.tenant for f in report.fired) == ["a1", "b2"]


def test_beat_dying_between_claim_and_publish_is_diagnosed_not_refired(cron_app, broker_url, r):
    from celery_app.cron_tasks.cron_state import FireRequest
    from celery_app.cron_tasks.service import CronService

    _declare(cron_app, "half-done")
    task = cron_tasks(cron_app)["half-done"]
    store = store_of(cron_app)
    # A beat took the window key, then died before publishing.
    store.claim([FireRequest(task, GLOBAL_TENANT, T0)], now=T0, owner="beat:dead")
    survivor = make_engine(cron_app, owner="engine-2")
    report = survivor.tick(T0 + timedelta(seconds=10))
    assert report.fired == ()
    assert [s.reason for s in real_skips(report)] == ["taken"]
    assert sends(broker_url) == {}
    findings = CronService(cron_app, clock=lambda: T0 + 3 * MIN).diagnose()
    assert (FindingKind.UNCONFIRMED, "half-done", T0) in found(findings), findings
    # A live beat's sweep turns the lost claim into a gap record, which outlives later windows.
    assert store.sweep_lost_claims(T0 + MIN, T0 + 3 * MIN) == [f"half-done|-|{window_id(T0)}"]
    end_runs(r)
    assert [f.task_id for f in survivor.tick(T0 + 4 * MIN).fired] == ["half-done"]
    findings = CronService(cron_app, clock=lambda: T0 + 5 * MIN).diagnose()
    assert FindingKind.UNCONFIRMED not in {f.kind for f in findings}
    (gap,) = [f for f in findings if f.kind == FindingKind.NOT_FIRED and f.since == T0]
    assert gap.subject == "half-done", findings
    assert "claimed by beat:dead, never published" in gap.message


def test_diagnose_reports_overdue_tasks_and_stays_quiet_when_on_time(cron_app, r):
    from celery_app.cron_tasks.service import CronService

    _declare(cron_app, "five-min", spec="*/5 * * * *")
    _declare(cron_app, "never-ran", spec="*/5 * * * *")
    r.hset(Keys("cbtest").beat_heartbeat(), "beat-x", (T0 + 30 * MIN).timestamp())
    engine = make_engine(cron_app)
    engine.tick(T0 + timedelta(seconds=1))  # both fire at 00:00
    r.delete(Keys("cbtest").cron_stats("never-ran"))
    r.hset(Keys("cbtest").cron_stats("never-ran"), "first_seen", (T0 + MIN).timestamp())
    on_time = CronService(cron_app, clock=lambda: T0 + 6 * MIN).diagnose()
    assert FindingKind.OVERDUE not in {f.kind for f in on_time}, on_time
    # 00:05 passed with no firing (no beat ran) and its grace is over by 00:07.
    late = CronService(cron_app, clock=lambda: T0 + 7 * MIN + timedelta(seconds=1)).diagnose()
    overdue = sorted((f for f in late if f.kind == FindingKind.OVERDUE), key=lambda f: f.subject)
    assert [(f.subject, f.since) for f in overdue] == [
        ("five-min", T0 + 5 * MIN),
        ("never-ran", T0 + 5 * MIN),
    ], late
    assert f"'five-min' is overdue: window {window_id(T0 + 5 * MIN)}" in overdue[0].message
    assert "never fired" in overdue[1].message


def test_declared_queue_is_where_the_message_goes(cron_app, broker_url):
    _declare(cron_app, "routed", queue="reports")
    _declare(cron_app, "default-queue")
    make_engine(cron_app).tick(T0 + timedelta(seconds=1))
    assert set(sends(broker_url, queues=("reports",))) == {("routed", GLOBAL_TENANT, window_id(T0))}
    assert set(sends(broker_url)) == {("default-queue", GLOBAL_TENANT, window_id(T0))}


SEC = timedelta(seconds=1)


def _fired(engine, at):
    return sorted((f.task_id, f.window) for f in engine.tick(at).fired)


def test_a_first_deployment_fires_nothing_stale_and_counts_intervals_from_first_sight(
    cron_app, broker_url, r
):
    _declare(cron_app, "minutely")
    cron_app.conf.beat_schedule = {"ping": {"task": "t.ping", "schedule": 20}}
    start = T0 + 30 * SEC  # a beat starts mid-window: the windows of T0 began before it
    engines = [make_engine(cron_app, start=start, owner=f"e{n}", seen=None) for n in range(2)]
    for engine in engines:
        assert _fired(engine, start) == []
    # Celery's beat: an interval `every` after it first saw it, a crontab at its next start
    assert _fired(engines[0], T0 + 50 * SEC) == [("ping", T0 + 50 * SEC)]
    assert _fired(engines[1], T0 + 50 * SEC) == []  # the other beat counts the same windows
    end_runs(r)
    assert _fired(engines[1], T0 + MIN) == [("minutely", T0 + MIN)]
    assert _fired(engines[0], T0 + 70 * SEC) == [("ping", T0 + 70 * SEC)]
    # a beat started later reads the same first sight (Keys.cron_ref), not its own start
    late = make_engine(cron_app, start=T0 + 85 * SEC, owner="late", seen=None)
    assert _fired(late, T0 + 90 * SEC) == [("ping", T0 + 90 * SEC)]
    assert set(sends(broker_url).values()) == {1}


def test_a_restart_catches_up_a_seen_tasks_window_and_a_changed_schedule_starts_afresh(
    cron_app, broker_url, r
):
    _declare(cron_app, "job")
    first = make_engine(cron_app, start=T0 + 10 * SEC, owner="first", seen=None)
    assert _fired(first, T0 + 10 * SEC) == []
    assert _fired(first, T0 + MIN) == [("job", T0 + MIN)]
    end_runs(r)
    # that beat dies; the next starts 20 s into the 00:02 window: the task has state, so the
    # window is caught up within its grace, as a restart or a failover must
    second = make_engine(cron_app, start=T0 + 2 * MIN + 20 * SEC, owner="second", seen=None)
    assert _fired(second, T0 + 2 * MIN + 20 * SEC) == [("job", T0 + 2 * MIN)]
    end_runs(r)
    # the same id with another spec is a new schedule: no catch-up, its next window
    unregister_cron("t.job", app=cron_app)
    _declare(cron_app, "job", spec="*/2 * * * *")
    third = make_engine(cron_app, start=T0 + 4 * MIN + 20 * SEC, owner="third", seen=None)
    assert _fired(third, T0 + 4 * MIN + 20 * SEC) == []
    assert _fired(third, T0 + 6 * MIN) == [("job", T0 + 6 * MIN)]


def test_tasks_that_fired_before_references_were_kept_keep_their_windows(cron_app, r):
    _declare(cron_app, "job")
    cron_app.conf.beat_schedule = {"ping": {"task": "t.ping", "schedule": 20}}
    for task_id in ("job", "ping"):  # what a deployment that predates references left
        r.hset(Keys("cbtest").cron_stats(task_id), "last_window", int((T0 - MIN).timestamp()))
    engine = make_engine(cron_app, start=T0 + 25 * SEC, owner="upgraded", seen=None)
    # caught up within the grace, and the interval keeps the epoch's phase (:00, :20, :40)
    assert _fired(engine, T0 + 25 * SEC) == [("job", T0), ("ping", T0 + 20 * SEC)]
    end_runs(r)
    assert _fired(engine, T0 + 40 * SEC) == [("ping", T0 + 40 * SEC)]


def test_diagnose_does_not_expect_a_new_task_in_the_window_it_was_first_seen_in(cron_app, r):
    from celery_app.cron_tasks.service import CronService

    _declare(cron_app, "hourly", spec="0 * * * *")
    r.hset(Keys("cbtest").beat_heartbeat(), "beat-x", (T0 + 30 * MIN).timestamp())
    engine = make_engine(cron_app, start=T0 + 30 * SEC, seen=None)
    assert _fired(engine, T0 + 30 * SEC) == []  # 00:00 began before any beat saw it
    quiet = CronService(cron_app, clock=lambda: T0 + 5 * MIN).diagnose()
    assert FindingKind.OVERDUE not in {f.kind for f in quiet}, quiet
    # its first window is 01:00: missed with no beat running, that one is reported
    late = CronService(cron_app, clock=lambda: T0 + 63 * MIN).diagnose()
    (overdue,) = [f for f in late if f.kind == FindingKind.OVERDUE]
    assert (overdue.subject, overdue.since) == ("hourly", T0 + 60 * MIN), late
    assert "never fired" in overdue.message


class _CollectorWatchingPublisher(CronPublisher):
    """The real publisher, noting whether the cyclic collector was on at each publish."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.collector_on: list[bool] = []

    def publish(self, requests, *, manual=False):
        self.collector_on.append(gc.isenabled())
        return super().publish(requests, manual=manual)


def test_a_due_tick_fires_with_the_collector_paused_and_restores_it(cron_app, broker_url, r):
    for i in range(30):
        _declare(cron_app, f"gc-{i}")
    engine = make_engine(cron_app)
    publisher = _CollectorWatchingPublisher(cron_app, engine.grace)
    engine.sender = publisher
    was_enabled = gc.isenabled()
    try:
        gc.enable()
        report = engine.tick(T0 + timedelta(seconds=1))
        assert len(report.fired) == 30
        assert publisher.collector_on == [False]
        assert gc.isenabled()  # on again after the tick
        end_runs(r)
        gc.disable()  # a process that runs without the collector keeps it off
        report = engine.tick(T0 + MIN + timedelta(seconds=1))
        assert len(report.fired) == 30
        assert publisher.collector_on == [False, False]
        assert not gc.isenabled()
    finally:
        (gc.enable if was_enabled else gc.disable)()
    assert sends(broker_url)[("gc-0", GLOBAL_TENANT, window_id(T0 + MIN))] == 1
