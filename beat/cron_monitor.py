"""Cron tasks watched by heartbeat checks: beat keeps one heartbeat check per monitored task and
turns each run the workers record into a ping of it.

Why in beat: beat knows every cron task (code, ``beat_schedule``, runtime) and reads what the
workers record of each run (``Keys.cron_state``: the window, its start, its end and outcome),
whichever worker ran it, even a plain one that knows nothing of checks. So a monitored task
needs nothing on its workers, and ``cron_tasks`` and ``checks`` stay apart.

- **The check**, ``cron.<task id>``, of tenant ``cron``, in the default region, is a heartbeat
  whose schedule is the task's: its cron spec and timezone, or its interval. The ping of a window
  is due by the window's start + the cron grace (how late it may be sent) + the task's timeout
  (how long it may run), and a run that started must end within the timeout.
- **A run longer than its expected duration** (``expected_duration`` of ``@cron``,
  ``beat_policy`` or ``schedule add``; default the timeout, so nothing more is watched) is
  degraded: the check's ``expected_duration`` makes beat's dispatcher record a degraded result
  at start + that duration while the run goes on, and the run's end ping carries its recorded
  duration, so one that ended late between two ticks is degraded too.
- **A run's start, success or failure** becomes a start, success or fail ping, once, whichever
  beat sees it first (``Keys.cron_monitor_mark``, SET NX).
- **A missed window** is a late heartbeat: beat's dispatcher records it
  (``checks/heartbeat.py``), so it moves the state and makes a transition, delivered once to the
  hooks and notification targets, like any check's.

Nothing is watched until a worker says it records cron runs (a worker with checkbeat installed):
runs that nobody records would all look missed.

What is not watched: per-tenant tasks (one window per tenant, and tenants come and go), tasks
with a custom schedule class (no fixed grid), and intervals that are not whole seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery_app.checks.heartbeat import Ping, PingKind, PingRefused, record_ping
from celery_app.checks.heartbeat_kind import HEARTBEAT_KIND
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import claim_and_publish
from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.registration import GLOBAL_TENANT, CronTask
from celery_app.errors import CheckExists, CheckFieldError
from celery_app.redis.clock import server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronOutcome, CronStateField
from celery_app.settings import Settings
from scheduling_core import CronError, parse

log = logging.getLogger(__name__)

#: The tenant of every cron task's heartbeat check.
MONITOR_TENANT = "cron"
#: The uid of a task's heartbeat check is this prefix and the task id.
MONITOR_PREFIX = "cron."
#: How long a start or end stays marked as pinged: longer than any beat takes to see it.
MARK_TTL = timedelta(hours=6)
_ENDED = {CronOutcome.SUCCESS, CronOutcome.FAILURE}


def monitor_uid(task_id: str) -> str:
    return f"{MONITOR_PREFIX}{task_id}"


def is_monitored(task: CronTask, settings: Settings) -> bool:
    """Whether ``CHECKBEAT_CRON_MONITOR`` names the task and its schedule can be watched."""
    chosen = settings.cron_monitor
    if chosen == "none" or (chosen != "all" and task.id not in chosen.split(",")):
        return False
    return (
        not task.per_tenant and not task.is_custom and heartbeat_config(task, settings) is not None
    )


def heartbeat_config(task: CronTask, settings: Settings) -> tuple[int, dict[str, Any]] | None:
    """(period, config) of the task's heartbeat check; None when its schedule cannot be one."""
    limit = max(task.timeout, task.expected)  # a beat_schedule entry's may pass its timeout
    grace = (task.grace or settings.cron_grace) + limit
    config: dict[str, Any] = {
        "grace": grace.total_seconds(),
        "max_duration": max(1.0, limit.total_seconds()),
    }
    if task.expected < limit:
        config["expected_duration"] = max(1.0, task.expected.total_seconds())
    if task.is_interval:
        every = task.window_length.total_seconds()
        if every < 1 or every != int(every) or every > 31 * 86_400:
            return None
        return int(every), config
    try:
        parse(task.spec)
    except CronError:
        return None
    config |= {"cron": task.spec, "timezone": task.timezone}
    return 60, config


def ensure_monitors(store: CheckStore, tasks: Sequence[CronTask]) -> list[str]:
    """Create or bring up to date the heartbeat check of every monitored task; the uids
    written. A check of another kind under the uid is left alone, and logged."""
    written = []
    for task in tasks:
        if not is_monitored(task, store.settings):
            continue
        period, config = heartbeat_config(task, store.settings)  # type: ignore[misc]  # monitored
        uid = monitor_uid(task.id)
        wanted: dict[str, Any] = {
            "tenant": MONITOR_TENANT,
            "kind": HEARTBEAT_KIND,
            "target": task.display_name,
            "period": period,
            "failure_threshold": 1,
            "success_threshold": 1,
        }
        try:
            existing = store.get(uid)
            if existing is None:
                store.create(uid=uid, **wanted, config=config)
                written.append(uid)
                continue
            old = existing.definition
            if old.kind != HEARTBEAT_KIND:
                log.warning(
                    "cron: check %s is a %s check: task %s not monitored", uid, old.kind, task.id
                )
                continue
            keep = {"token": old.config.get("token")}
            if old.period != period or {**old.config, **keep} != {**config, **keep}:
                store.update(uid, period=period, config={**config, **keep})
                written.append(uid)
        except CheckExists:
            continue  # another beat created it a moment ago
        except CheckFieldError as exc:
            log.warning("cron: task %s cannot be monitored: %s", task.id, exc)
    return written


class CronMonitor:
    """A beat driver: every ``interval`` seconds, each monitored task's latest recorded run
    becomes a ping of its heartbeat check (once across beats)."""

    def __init__(self, app: Any, tasks: Sequence[CronTask] = ()) -> None:
        from celery_app.factory import settings_of
        from celery_app.redis.client import get_redis

        self.app = app
        self.settings = settings_of(app)
        self.redis = get_redis(self.settings.redis_url, self.settings)
        self.interval = self.settings.dispatch_interval
        self.keys = state_keys(self.settings)
        self.tasks: list[CronTask] = []
        self._made = False
        self.set_tasks(list(tasks))

    def set_tasks(self, tasks: Sequence[CronTask]) -> None:
        """The monitored tasks (after a reload of the task list); their checks are made at the
        next tick that finds a worker recording cron runs."""
        self.tasks = [t for t in tasks if is_monitored(t, self.settings)]
        self._made = False

    def tick(self) -> int:
        """Ping what ran since the last tick; how many pings. Until a worker says it records
        cron runs (``cron_tasks.recorders``) nothing is watched: runs nobody records would all
        look missed."""
        if not self.tasks:
            return 0
        if not self._made:
            if not recorders.live(self.redis, self.keys, time.time()):
                return 0
            ensure_monitors(CheckStore(self.redis, self.keys, self.settings), self.tasks)
            self._made = True
        pipe = self.redis.pipeline(transaction=False)
        for task in self.tasks:
            pipe.hgetall(self.keys.cron_state(task.id, GLOBAL_TENANT))
        pinged = 0
        for task, state in zip(self.tasks, pipe.execute(), strict=True):
            try:
                pinged += self._ping_run(task, state)
            except Exception:
                log.exception("cron: monitoring the run of %s failed; retried next tick", task.id)
        return pinged

    def _ping_run(self, task: CronTask, state: dict[str, str]) -> int:
        window = state.get(CronStateField.LAST_RUN_WINDOW)
        start = float(state.get(CronStateField.LAST_START) or 0)
        end = float(state.get(CronStateField.LAST_END) or 0)
        outcome = state.get(CronStateField.OUTCOME)
        if not window or not start:
            return 0
        if end >= start and outcome in _ENDED:
            failed = outcome == CronOutcome.FAILURE
            ping = Ping(
                PingKind.FAIL if failed else PingKind.SUCCESS,
                duration_s=max(0.0, end - start),
                body=(state.get(CronStateField.LAST_ERROR) or "")[:2000] if failed else "",
            )
            return self._once(task, window, "end", ping)
        if outcome == CronOutcome.RUNNING:
            return self._once(task, window, "start", Ping(PingKind.START))
        return 0

    def _once(self, task: CronTask, window: str, phase: str, ping: Ping) -> int:
        mark = self.keys.cron_monitor_mark(task.id, GLOBAL_TENANT, window, phase)
        if not self.redis.set(mark, "1", nx=True, px=int(MARK_TTL.total_seconds() * 1000)):
            return 0  # another beat (or this one's earlier tick) pinged it
        uid = monitor_uid(task.id)
        try:
            done = record_ping(self.redis, self.keys, self.settings, uid, ping)
        except PingRefused as exc:  # its check was deleted or replaced by hand
            log.warning("cron: run of %s not pinged: %s", task.id, exc)
            return 0
        if done.transitions:
            keys = self.keys.of_check(uid)
            now = server_time(self.redis)
            claim_and_publish(self.app, self.redis, keys, self.settings, now, done.transitions)
        return 1
