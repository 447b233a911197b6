"""Which cron tasks a heartbeat check watches and with what schedule (``beat/cron_monitor.py``),
and that beat makes each monitored task's check once, only when a worker records runs."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.adoption import FlagSchedule
from support.cron import seen_since, store_of
from support.polling import wait_for

from beat.cron_engine import CronEngine
from beat.cron_monitor import (
    CUSTOM_PERIOD,
    CronMonitor,
    heartbeat_config,
    is_monitored,
    monitor_uid,
)
from celery_app.checks.check_state import read_transitions
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.recording import store_for
from celery_app.cron_tasks.registration import (
    GLOBAL_TENANT,
    CronSpecError,
    cron,
    interval_window_id,
    window_id,
    window_start,
)
from celery_app.cron_tasks.runtime import add_schedule, runtime_store
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.cron_tasks.task_sources import all_tasks, beat_policy
from celery_app.factory import settings_of
from celery_app.names import is_id
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CheckStateField, CronOutcome, JobField
from celery_app.settings import load_settings


def _noop(*_a, **_k) -> None: ...


def _tasks(cron_app) -> dict:
    cron("*/5 * * * *", app=cron_app, id="report", name="m.report",
         timeout=timedelta(minutes=2), timezone="Europe/Paris")(_noop)  # fmt: skip
    cron("0 3 * * *", app=cron_app, id="per-t", name="m.per_t", per_tenant=True)(_noop)
    cron_app.conf.beat_schedule = {
        "ping": {"task": "m.ping", "schedule": 20.0},
        "odd": {"task": "m.odd", "schedule": 2.5},
    }
    return all_tasks(cron_app)


def test_which_tasks_are_watched_and_their_heartbeat(cron_app):
    tasks = _tasks(cron_app)
    settings = settings_of(cron_app)
    watched = sorted(t for t, task in tasks.items() if is_monitored(task, settings))
    assert watched == ["per-t", "ping", "report"]  # not a 2.5 s interval
    no_tenants = load_settings(tenants_provider="none")  # per-tenant tasks do not fire
    assert not is_monitored(tasks["per-t"], no_tenants) and is_monitored(tasks["ping"], no_tenants)
    _period, config = heartbeat_config(tasks["report"], settings)
    assert config["cron"] == "*/5 * * * *" and config["timezone"] == "Europe/Paris"
    assert config["grace"] == (settings.cron_grace + timedelta(minutes=2)).total_seconds()
    assert config["max_duration"] == 120
    assert heartbeat_config(tasks["ping"], settings)[0] == 20
    only = load_settings(cron_monitor="ping")
    assert [t for t in tasks if is_monitored(tasks[t], only)] == ["ping"]
    none = load_settings(cron_monitor="none")
    assert not any(is_monitored(task, none) for task in tasks.values())


def test_checks_are_made_once_a_worker_records_runs(cron_app, r):
    tasks = list(_tasks(cron_app).values())
    settings = settings_of(cron_app)
    keys = state_keys(settings)
    monitor = CronMonitor(cron_app, tasks)
    assert monitor.tick() == 0
    assert not r.exists(keys.check(monitor_uid("report")))  # nobody records runs yet
    recorders.mark(r, keys, "w@h", time.time())
    monitor.tick()
    store = CheckStore(r, keys, settings)
    made = store.get(monitor_uid("report")).definition
    assert made.kind == "heartbeat" and made.tenant == "cron" and made.failure_threshold == 1
    token = made.config["token"]
    CronMonitor(cron_app, tasks).tick()  # a second beat: the same check, its token kept
    assert store.get(monitor_uid("report")).definition.config["token"] == token
    assert store.uids() == [monitor_uid("ping"), monitor_uid("report")]


# --- expected duration -------------------------------------------------------------------


def _watched(cron_app, r) -> tuple[list, Any, CronMonitor]:
    """The app's tasks, its keys and a beat's cron monitor that has made their checks, with a
    worker marked as recording runs (else nothing is watched)."""
    tasks = list(all_tasks(cron_app).values())
    keys = state_keys(settings_of(cron_app))
    recorders.mark(r, keys, "w@h", time.time())
    monitor = CronMonitor(cron_app, tasks)
    monitor.tick()
    return tasks, keys, monitor


def _moves(r, keys, uid: str) -> list[tuple[str, str]]:
    found = reversed(read_transitions(r, keys.check_transitions(uid)))
    return [(t["from"], t["to"]) for t in found]


def _last(r, keys, uid: str) -> dict:
    return json.loads(r.hget(keys.last_result(uid), "local"))


def test_expected_duration_is_the_heartbeat_degraded_band_and_defaults_to_the_timeout(cron_app):
    settings = settings_of(cron_app)
    cron("*/5 * * * *", app=cron_app, id="slow", name="m.slow", timeout=timedelta(minutes=2),
         expected_duration=timedelta(seconds=30))(_noop)  # fmt: skip
    cron("*/5 * * * *", app=cron_app, id="plain", name="m.plain",
         timeout=timedelta(seconds=60))(_noop)  # fmt: skip
    cron_app.conf.beat_schedule = {
        "long": {"task": "m.long", "schedule": 3600.0},
        "short": {"task": "m.short", "schedule": 3600.0},
    }
    beat_policy(cron_app, "long", expected_duration=1800)  # past the 5 min default timeout
    beat_policy(cron_app, "short", expected_duration=timedelta(seconds=20))
    tasks = all_tasks(cron_app)
    slow = heartbeat_config(tasks["slow"], settings)[1]
    assert slow["expected_duration"] == 30 and slow["max_duration"] == 120
    plain = heartbeat_config(tasks["plain"], settings)[1]
    assert "expected_duration" not in plain and plain["max_duration"] == 60  # as today
    long = heartbeat_config(tasks["long"], settings)[1]
    assert "expected_duration" not in long and long["max_duration"] == 1800
    assert long["grace"] == (settings.cron_grace + timedelta(seconds=1800)).total_seconds()
    short = heartbeat_config(tasks["short"], settings)[1]
    assert short["expected_duration"] == 20 and short["max_duration"] == 300
    add_schedule(cron_app, "rt", task="m.rt", remote_task=True, every="20s", timeout="1m",
                 expected_duration="15s")  # fmt: skip
    runtime = all_tasks(cron_app, runtime_store(cron_app))["rt"]  # read back from Redis
    assert heartbeat_config(runtime, settings)[1]["expected_duration"] == 15


@pytest.mark.parametrize(
    "declare",
    [
        lambda app: cron("* * * * *", app=app, id="a", name="m.a", expected_duration=0)(_noop),
        lambda app: cron(
            "* * * * *",
            app=app,
            id="a",
            name="m.a",
            timeout=timedelta(seconds=60),
            expected_duration=timedelta(seconds=61),
        )(_noop),
        lambda app: cron("* * * * *", app=app, id="a", name="m.a", expected_duration="1h")(_noop),
        lambda app: beat_policy(app, "e", expected_duration=-5),
        lambda app: beat_policy(app, "e", expected_duration=timedelta(days=32)),
    ],
)
def test_a_bad_expected_duration_is_refused_naming_it(cron_app, declare):
    with pytest.raises(CronSpecError, match="expected_duration must be"):
        declare(cron_app)


def test_a_run_past_its_expected_duration_is_degraded_once_and_the_next_good_run_up(cron_app, r):
    """Still running past the expected duration: degraded by beat's dispatcher (no worker);
    its late success keeps it degraded (no second transition); a run within it: up."""
    cron("* * * * *", app=cron_app, id="slow", name="m.slow", timeout=timedelta(seconds=60),
         expected_duration=1)(_noop)  # fmt: skip
    tasks, keys, monitor = _watched(cron_app, r)
    uid = monitor_uid("slow")
    dispatcher = Dispatcher(cron_app, client=r, partition=keys.of_check(uid).partition)
    workers = store_for(cron_app)
    now = datetime.now(UTC)
    window = window_id(window_start(now))
    workers.run_started("slow", GLOBAL_TENANT, window, False, now)
    assert monitor.tick() == 1  # the start ping
    assert CronMonitor(cron_app, tasks).tick() == 0  # a second beat: pinged already

    def degraded() -> bool:
        dispatcher.tick()
        return r.hget(keys.check_state(uid), CheckStateField.STATE) == "degraded"

    wait_for(degraded, 10, interval=0.05, what="the run degraded past its expected 1 s")
    assert "still running after" in _last(r, keys, uid)["degraded"]
    for _ in range(3):
        dispatcher.tick()
    assert _moves(r, keys, uid) == [("up", "degraded")]  # once, the run still going

    workers.run_finished("slow", GLOBAL_TENANT, window, CronOutcome.SUCCESS, "", datetime.now(UTC))
    assert monitor.tick() == 1
    late = _last(r, keys, uid)
    assert late["status"] == "up" and "longer than its expected 1 s" in late["degraded"]
    assert _moves(r, keys, uid) == [("up", "degraded")]  # finished late: the same state

    nxt = window_id(window_start(now) + timedelta(minutes=1))
    start = datetime.now(UTC)
    workers.run_started("slow", GLOBAL_TENANT, nxt, False, start)
    workers.run_finished("slow", GLOBAL_TENANT, nxt, CronOutcome.SUCCESS, "",
                         start + timedelta(seconds=0.5))  # fmt: skip
    assert monitor.tick() == 1
    assert _moves(r, keys, uid) == [("up", "degraded"), ("degraded", "up")]


def test_a_run_that_finished_past_its_expected_duration_unseen_running_is_one_transition(
    cron_app, r
):
    """A run beat never saw running (it ended between two ticks) is judged by its recorded
    duration: one degraded transition; a failed run then goes down, one more."""
    cron("* * * * *", app=cron_app, id="job", name="m.job", timeout=timedelta(seconds=60),
         expected_duration=2)(_noop)  # fmt: skip
    _, keys, monitor = _watched(cron_app, r)
    uid = monitor_uid("job")
    workers = store_for(cron_app)
    start = window_start(datetime.now(UTC))
    for minute, took, outcome in [(0, 5, CronOutcome.SUCCESS), (1, 1, CronOutcome.FAILURE)]:
        window = window_id(start + timedelta(minutes=minute))
        began = datetime.now(UTC)
        workers.run_started("job", GLOBAL_TENANT, window, False, began)
        workers.run_finished("job", GLOBAL_TENANT, window, outcome, "boom",
                             began + timedelta(seconds=took))  # fmt: skip
        assert monitor.tick() == 1
    assert _moves(r, keys, uid) == [("up", "degraded"), ("degraded", "down")]
    assert _last(r, keys, uid)["status"] == "down"


# --- per-tenant tasks --------------------------------------------------------------------


def test_a_per_tenant_check_uid_is_a_valid_uid_unique_per_task_and_tenant():
    assert monitor_uid("sync") == "cron.sync"
    assert monitor_uid("sync", "acme") == "cron.sync.acme"
    made = {
        monitor_uid(task, tenant)
        for task, tenant in [
            ("sync", "ann@corp.com"), ("sync", "ann_corp.com"), ("s" * 200, "acme"),
            ("s" * 200, "acme2"), ("s" * 195, GLOBAL_TENANT), ("sync", "a" * 128),
        ]
    }  # fmt: skip
    assert len(made) == 6 and all(is_id(uid) for uid in made)


def test_each_active_tenant_has_its_check_and_a_tenant_that_left_is_not_reported_missing(
    cron_app, r
):
    """Three tenants of a per-tenant task: acme's failed run takes its check down, initech's
    silence too (each one transition, in that tenant's stream), globex leaves and its check is
    paused by another beat, so its silence makes none; when it comes back its check is on
    again, not late."""
    add_schedule(cron_app, "sync", task="m.sync", remote_task=True, every="1s", timeout="1s",
                 grace="0.1s", per_tenant=True)  # fmt: skip
    tasks = list(all_tasks(cron_app, runtime_store(cron_app)).values())
    keys = state_keys(settings_of(cron_app))
    tenants = ["acme", "globex", "initech"]
    r.sadd(keys.tenants(), *tenants)
    recorders.mark(r, keys, "w@h", time.time())
    monitor = CronMonitor(cron_app, tasks)
    monitor.tick()
    store = CheckStore(r, keys, settings_of(cron_app))
    for tenant in tenants:
        made = store.get(f"cron.sync.{tenant}").definition
        assert made.tenant == tenant and made.kind == "heartbeat" and made.enabled
    assert r.smembers(keys.cron_monitor_tenants("sync")) == set(tenants)

    workers = store_for(cron_app)
    now = datetime.now(UTC)
    window = interval_window_id(now.replace(microsecond=0))
    for tenant, outcome in [("acme", CronOutcome.FAILURE), ("globex", CronOutcome.SUCCESS)]:
        workers.run_started("sync", tenant, window, False, now)
        workers.run_finished("sync", tenant, window, outcome, "boom", now)
    assert monitor.tick() == 2

    r.srem(keys.tenants(), "globex")
    CronMonitor(cron_app, tasks).tick()  # another beat sees globex leave
    assert not store.get("cron.sync.globex").definition.enabled
    assert r.smembers(keys.cron_monitor_tenants("sync")) == {"acme", "initech"}

    dispatcher = Dispatcher(cron_app, client=r, partition=keys.of_check("cron.sync.x").partition)

    def initech_down() -> bool:
        dispatcher.tick()
        return r.hget(keys.check_state("cron.sync.initech"), CheckStateField.STATE) == "down"

    wait_for(initech_down, 15, interval=0.05, what="the silent tenant's check down")
    globex_deadline = float(r.time()[0]) + 3  # past globex's deadline had it stayed on

    def past_globex_deadline() -> bool:
        dispatcher.tick()
        return float(r.time()[0]) > globex_deadline

    wait_for(past_globex_deadline, 10, interval=0.05, what="globex's deadline passed")
    assert _moves(r, keys, "cron.sync.acme") == [("up", "down")]
    assert _moves(r, keys, "cron.sync.initech") == [("up", "down")]
    assert _moves(r, keys, "cron.sync.globex") == []
    assert [r.xlen(keys.tenant_transitions(t)) for t in tenants] == [1, 0, 1]

    r.sadd(keys.tenants(), "globex")
    CronMonitor(cron_app, tasks).tick()  # a beat sees it come back
    assert store.get("cron.sync.globex").definition.enabled
    dispatcher.tick()
    assert _moves(r, keys, "cron.sync.globex") == []  # placed afresh, not late


# --- custom schedule classes -------------------------------------------------------------


def test_a_custom_schedule_is_watched_from_its_own_estimate_failure_success_then_a_miss(
    cron_app, r, redis_url
):
    """A project's own BaseSchedule (every 2 s while a flag is on), fired by the real engine:
    each run's end ping carries when the schedule says it is next due (its remaining_estimate
    from the shared last run), so the deadline is that + grace + limit. A failed run, a good
    one, then no run (flag off): one transition each, down, up, down."""
    flag = "cronmon:flag"
    r.set(flag, "on")
    every = timedelta(seconds=2)
    cron_app.conf.beat_schedule = {
        "flagged": {"task": "m.flagged", "schedule": FlagSchedule(redis_url, flag, every)}
    }
    # an entry's limit is the 5 min default: made short so the miss comes within the test
    task = replace(all_tasks(cron_app)["flagged"], timeout=timedelta(seconds=1),
                   grace=timedelta(seconds=0.2))  # fmt: skip
    assert task.is_custom
    settings, keys = settings_of(cron_app), state_keys(settings_of(cron_app))
    uid = monitor_uid("flagged")
    period, config = heartbeat_config(task, settings)
    assert period == CUSTOM_PERIOD and "cron" not in config and config["grace"] == 1.2
    recorders.mark(r, keys, "w@h", time.time())
    monitor = CronMonitor(cron_app, [task])
    monitor.tick()
    assert CheckStore(r, keys, settings).get(uid).definition.period == CUSTOM_PERIOD
    workers = store_of(cron_app)
    seen_since(cron_app, datetime.now(UTC) - timedelta(seconds=10))
    publisher = CronPublisher(cron_app, settings.cron_grace)
    publisher.prepare([task])
    engine = CronEngine([task], workers, publisher, None, grace=settings.cron_grace,
                        owner="beat-1")  # fmt: skip
    dispatcher = Dispatcher(cron_app, client=r, partition=keys.of_check(uid).partition)

    for outcome, state in [(CronOutcome.FAILURE, "down"), (CronOutcome.SUCCESS, "up")]:
        before = r.get(keys.cron_ref("flagged", task.fingerprint))
        wait_for(lambda: engine.tick().fired, 10, interval=0.05, what="the schedule fired")
        # a custom schedule's window is named after the last run it was due from
        wid = interval_window_id(datetime.fromtimestamp(float(before), UTC))
        began = datetime.now(UTC)
        workers.run_started("flagged", GLOBAL_TENANT, wid, False, began)
        workers.run_finished("flagged", GLOBAL_TENANT, wid, outcome, "boom",
                             began + timedelta(seconds=0.1))  # fmt: skip
        assert monitor.tick() == 1
        assert r.hget(keys.check_state(uid), CheckStateField.STATE) == state
        last_run = float(r.get(keys.cron_ref("flagged", task.fingerprint)))
        deadline = float(r.hget(keys.job(f"{uid}@local"), JobField.SCHEDULED_AT))
        assert abs(deadline - (last_run + every.total_seconds() + 1.2)) < 0.05

    r.set(flag, "off")  # the schedule stops being due: nothing fires, nothing runs

    def down() -> bool:
        engine.tick()
        dispatcher.tick()
        return r.hget(keys.check_state(uid), CheckStateField.STATE) == "down"

    wait_for(down, 15, interval=0.05, what="the missed run seen")
    assert float(r.time()[0]) + 1 >= deadline  # not before its deadline
    assert "no success ping by" in _last(r, keys, uid)["error"]
    assert _moves(r, keys, uid) == [("up", "down"), ("down", "up"), ("up", "down")]
