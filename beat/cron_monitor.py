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
- **A per-tenant task** has one check per (task, active tenant): ``cron.<task id>.<tenant>``
  (a hashed uid when that is no valid uid, :func:`monitor_uid`), of that tenant, so the
  tenant's notification targets apply. The tenants are read from the tenants provider (every
  ``TENANTS_REFRESH_S`` at most, or half the task's grace if shorter): a tenant that appears
  gets its check (or its paused one back), one that leaves has its check paused (disabled: no
  miss is recorded, its history is kept), so a departed tenant is never reported missing.
  ``Keys.cron_monitor_tenants`` holds which tenants' checks are on, so any beat pauses the
  check of a tenant that left while it was away.
- **A custom schedule class** (a ``beat_schedule`` entry with no fixed grid: ``solar``, a
  ``BaseSchedule`` of the project's own) has no period: its check's is the longest a check may
  have (``CUSTOM_PERIOD``), and each run's end ping carries when the schedule says it is next
  due (``next_at``: :meth:`CustomSchedule.next_after` of the shared last run, what beat's
  ``remaining_estimate`` gives), so the next deadline is that instant + the grace + the limit.
  A failed run and an over-long one are watched as for any task; a miss only from the first
  run on (before it, nothing says when one is due), and not at all for a schedule that cannot
  estimate (``remaining_estimate`` raises or returns no timedelta): then the deadline stays a
  ``CUSTOM_PERIOD`` away.
- **A run's start, success or failure** becomes a start, success or fail ping, once, whichever
  beat sees it first (``Keys.cron_monitor_mark``, SET NX).
- **A missed window** is a late heartbeat: beat's dispatcher records it
  (``checks/heartbeat.py``), so it moves the state and makes a transition, delivered once to the
  hooks and notification targets, like any check's.

Nothing is watched in a project that only set ``beat_scheduler`` (its plain workers would
discard the transitions as unregistered tasks: ``beat.scheduler.build_drivers`` leaves the
monitor out), nor until a worker says it records cron runs: runs that nobody records would all
look missed.

What is not watched: intervals that are not whole seconds; per-tenant tasks when no tenants
provider is set (``CHECKBEAT_TENANTS_PROVIDER=none``: they do not fire). A task that leaves the
list (removed, or ``schedule pause``) keeps its check, which then reports its windows missed:
pause or delete the check (``checks disable|rm``) with it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from celery_app.checks.definition import MAX_PERIOD_S
from celery_app.checks.heartbeat import Ping, PingKind, PingRefused, record_ping
from celery_app.checks.heartbeat_kind import HEARTBEAT_KIND
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import claim_and_publish
from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.celery_schedules import CustomSchedule
from celery_app.cron_tasks.registration import GLOBAL_TENANT, CronTask
from celery_app.cron_tasks.tenants_provider import TenantsSource, read_tenants, resolve_tenants
from celery_app.errors import CheckExists, CheckFieldError, CheckNotFound
from celery_app.names import MAX_ID, is_id
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
#: The period of a custom schedule's check: the longest a check may have (its deadlines come
#: from the schedule's own estimate, carried by each end ping).
CUSTOM_PERIOD = MAX_PERIOD_S
#: How long a start or end stays marked as pinged: longer than any beat takes to see it.
MARK_TTL = timedelta(hours=6)
#: How often, at most, the tenants of per-tenant tasks are read again (a provider may query a
#: database); sooner when a task's grace is short, so that a tenant that left has its check
#: paused before the deadline of the window it no longer runs.
TENANTS_REFRESH_S = 10.0
_ENDED = {CronOutcome.SUCCESS, CronOutcome.FAILURE}
_NOT_UID = re.compile(r"[^A-Za-z0-9_.\-]")
_DIGEST = 12


def monitor_uid(task_id: str, tenant: str = GLOBAL_TENANT) -> str:
    """The uid of the heartbeat check of a task (``cron.<task id>``), or of one tenant of a
    per-tenant task (``cron.<task id>.<tenant>``). A uid is at most 200 letters, digits, '_',
    '.' or '-' (a tenant may hold '@', and the two ids together may be longer): then the
    readable part is cut and made valid, and a digest of (task id, tenant) keeps it unique."""
    uid = f"{MONITOR_PREFIX}{task_id}"
    if tenant != GLOBAL_TENANT:
        uid = f"{uid}.{tenant}"
    if is_id(uid):
        return uid
    digest = hashlib.sha1(f"{task_id}|{tenant}".encode()).hexdigest()[:_DIGEST]
    return f"{_NOT_UID.sub('_', uid)[: MAX_ID - _DIGEST - 1]}-{digest}"


def is_monitored(task: CronTask, settings: Settings) -> bool:
    """Whether ``CHECKBEAT_CRON_MONITOR`` names the task and its schedule can be watched (a
    per-tenant task: when a tenants provider is set)."""
    chosen = settings.cron_monitor
    if chosen == "none" or (chosen != "all" and task.id not in chosen.split(",")):
        return False
    if task.per_tenant and settings.tenants_provider == "none":
        return False
    return heartbeat_config(task, settings) is not None


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
    if task.is_custom:
        return CUSTOM_PERIOD, config
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
    """Create or bring up to date the heartbeat check of every monitored global task; the uids
    written. A check of another kind under the uid is left alone, and logged."""
    return [
        uid
        for task in tasks
        if not task.per_tenant and is_monitored(task, store.settings)
        for uid in [ensure_monitor(store, task, GLOBAL_TENANT)]
        if uid is not None
    ]


def ensure_monitor(
    store: CheckStore, task: CronTask, tenant: str, *, enable: bool = False
) -> str | None:
    """Create or bring up to date the heartbeat check of ``task`` (of ``tenant``, for a
    per-tenant task); ``enable``: turn a paused one back on (a tenant that came back). The uid
    when written, else None. A check of another kind or tenant under the uid is left alone, and
    logged."""
    period, config = heartbeat_config(task, store.settings)  # type: ignore[misc]  # monitored
    uid = monitor_uid(task.id, tenant)
    per_tenant = tenant != GLOBAL_TENANT
    wanted: dict[str, Any] = {
        "tenant": tenant if per_tenant else MONITOR_TENANT,
        "kind": HEARTBEAT_KIND,
        "target": f"{task.display_name} ({tenant})" if per_tenant else task.display_name,
        "period": period,
        "failure_threshold": 1,
        "success_threshold": 1,
    }
    try:
        existing = store.get(uid)
        if existing is None:
            store.create(uid=uid, **wanted, config=config)
            return uid
        old = existing.definition
        if old.kind != HEARTBEAT_KIND or old.tenant != wanted["tenant"]:
            log.warning(
                "cron: check %s is a %s check of tenant %s: task %s (%s) not monitored",
                uid, old.kind, old.tenant, task.id, tenant,
            )  # fmt: skip
            return None
        keep = {"token": old.config.get("token")}
        changed = old.period != period or {**old.config, **keep} != {**config, **keep}
        if changed:
            store.update(uid, period=period, config={**config, **keep})
        if enable and not old.enabled:
            store.set_enabled(uid, True)
        return uid if changed or (enable and not old.enabled) else None
    except CheckExists:
        return None  # another beat created it a moment ago
    except CheckFieldError as exc:
        log.warning("cron: task %s (%s) cannot be monitored: %s", task.id, tenant, exc)
        return None


def pause_monitor(store: CheckStore, task: CronTask, tenant: str) -> bool:
    """Pause the heartbeat check of a tenant that left a per-tenant task (no miss is recorded
    while it is off); whether it was on."""
    uid = monitor_uid(task.id, tenant)
    existing = store.get(uid)
    if existing is None or existing.definition.tenant != tenant or not existing.definition.enabled:
        return False
    try:
        store.set_enabled(uid, False)
    except CheckNotFound:
        return False  # deleted meanwhile
    return True


class CronMonitor:
    """A beat driver: every ``interval`` seconds, each monitored task's latest recorded run
    (each active tenant's, for a per-tenant task) becomes a ping of its heartbeat check (once
    across beats)."""

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
        self._source: TenantsSource | None = None
        self._tenants: list[str] = []
        self._tenants_read_at: float | None = None  # monotonic; None: read at the next tick
        self.set_tasks(list(tasks))

    def set_tasks(self, tasks: Sequence[CronTask]) -> None:
        """The monitored tasks (after a reload of the task list); their checks are made at the
        next tick that finds a worker recording cron runs."""
        self.tasks = [t for t in tasks if is_monitored(t, self.settings)]
        self._made = False
        self._tenants_read_at = None
        graces = [
            heartbeat_config(t, self.settings)[1]["grace"]  # type: ignore[index]  # is_monitored: a config
            for t in self.tasks
            if t.per_tenant
        ]
        self._refresh_s = min([TENANTS_REFRESH_S, *(g / 2 for g in graces)])

    def tick(self) -> int:
        """Ping what ran since the last tick; how many pings. Until a worker says it records
        cron runs (``cron_tasks.recorders``) nothing is watched: runs nobody records would all
        look missed."""
        if not self.tasks:
            return 0
        store = CheckStore(self.redis, self.keys, self.settings)
        if not self._made:
            if not recorders.live(self.redis, self.keys, time.time()):
                return 0
            ensure_monitors(store, self.tasks)
        self._sync_tenants(store)
        self._made = True
        pairs = [
            (task, tenant)
            for task in self.tasks
            for tenant in (self._tenants if task.per_tenant else [GLOBAL_TENANT])
        ]
        pipe = self.redis.pipeline(transaction=False)
        for task, tenant in pairs:
            pipe.hgetall(self.keys.cron_state(task.id, tenant))
        pinged = 0
        for (task, tenant), state in zip(pairs, pipe.execute(), strict=True):
            try:
                pinged += self._ping_run(task, tenant, state)
            except Exception:
                log.exception(
                    "cron: monitoring the run of %s (%s) failed; retried next tick", task.id, tenant
                )
        return pinged

    def _sync_tenants(self, store: CheckStore) -> None:
        """Read the active tenants (at most every TENANTS_REFRESH_S) and make each per-tenant
        task's checks follow them: a check for a tenant that came, paused for one that left."""
        per_tenant = [t for t in self.tasks if t.per_tenant]
        now = time.monotonic()
        if not per_tenant or (
            self._tenants_read_at is not None and now - self._tenants_read_at < self._refresh_s
        ):
            return
        try:
            if self._source is None:
                self._source = resolve_tenants(self.app)
            if self._source is None:
                return
            tenants = read_tenants(self._source)
        except Exception as exc:  # the provider failed: keep watching the tenants known
            log.warning("cron: tenants not read for monitoring, kept as they were: %s", exc)
            return
        self._tenants_read_at = now
        active = set(tenants)
        for task in per_tenant:
            key = self.keys.cron_monitor_tenants(task.id)
            had = set(cast("set[str]", self.redis.smembers(key)))
            for tenant in tenants:
                if tenant not in had or not self._made:  # new, back, or this beat's first look
                    ensure_monitor(store, task, tenant, enable=tenant not in had)
            if active - had:
                self.redis.sadd(key, *sorted(active - had))
            for tenant in sorted(had - active):
                if pause_monitor(store, task, tenant):
                    log.info("cron: tenant %s left %s: its check paused", tenant, task.id)
                self.redis.srem(key, tenant)
        self._tenants = tenants

    def _ping_run(self, task: CronTask, tenant: str, state: dict[str, str]) -> int:
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
                next_at=self._next_at(task) if task.is_custom else None,
            )
            return self._once(task, tenant, window, "end", ping)
        if outcome == CronOutcome.RUNNING:
            return self._once(task, tenant, window, "start", Ping(PingKind.START))
        return 0

    def _next_at(self, task: CronTask) -> float | None:
        """When a custom schedule is next due after its last run (the one all beats share,
        ``Keys.cron_ref``), by its own estimate; None when it cannot say."""
        assert isinstance(task.schedule, CustomSchedule)
        raw = self.redis.get(self.keys.cron_ref(task.id, task.fingerprint))
        if raw is None:
            return None
        found = task.schedule.next_after(datetime.fromtimestamp(float(raw), UTC))
        return None if found is None else found.timestamp()

    def _once(self, task: CronTask, tenant: str, window: str, phase: str, ping: Ping) -> int:
        mark = self.keys.cron_monitor_mark(task.id, tenant, window, phase)
        if not self.redis.set(mark, "1", nx=True, px=int(MARK_TTL.total_seconds() * 1000)):
            return 0  # another beat (or this one's earlier tick) pinged it
        uid = monitor_uid(task.id, tenant)
        try:
            done = record_ping(self.redis, self.keys, self.settings, uid, ping)
        except PingRefused as exc:  # its check was deleted or replaced by hand
            log.warning("cron: run of %s (%s) not pinged: %s", task.id, tenant, exc)
            return 0
        if done.transitions:
            keys = self.keys.of_check(uid)
            now = server_time(self.redis)
            claim_and_publish(self.app, self.redis, keys, self.settings, now, done.transitions)
        return 1
