"""Which cron tasks a heartbeat check watches and with what schedule (``beat/cron_monitor.py``),
and that beat makes each monitored task's check once, only when a worker records runs."""

from __future__ import annotations

import time
from datetime import timedelta

from beat.cron_monitor import CronMonitor, heartbeat_config, is_monitored, monitor_uid
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.registration import cron
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.factory import settings_of
from celery_app.redis.keyspace import state_keys
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
    assert watched == ["ping", "report"]  # not per-tenant, not a 2.5 s interval
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
