"""What ``celery schedule list|run|diagnose`` do, over the Redis state, usable from any machine.

Why separate from the click code: the tests call these directly as well as through the CLI, and
the decisions (what counts as overdue, what a run-now may do) stay in plain functions.

Run-now takes the window key of the current window, the same key the beat takes: a run-now and
the window firing at once produce one run. A manual run therefore consumes the current window
of that task (and tenant): a scheduled firing in the same window is skipped as taken, a second
run-now in the same window is refused. The key's value names who took it (``manual:<host>`` or
``beat:<id>``), and the run is recorded with ``manual=1``. A forced run-now (``--force``) that
finds the window taken runs anyway, as a run of its own: its "window" is the instant it was
asked for (a microsecond id no schedule has), with no window or in-flight key to take, so it
neither consumes nor waits for a scheduled window.

Whether the workers record runs (:mod:`celery_app.cron_tasks.recorders`) decides what a missing
record means: on workers that run checkbeat's recording, a fired window with no start was lost;
on plain Celery workers nothing is ever recorded, and list, diagnose and ``run --wait`` say so
instead of guessing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from celery import Celery, states
from celery.backends.base import DisabledBackend

from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.cron_state import (
    CronStore,
    FireRequest,
    parse_window_id,
    split_member,
    task_deadline,
)
from celery_app.cron_tasks.firing import fire
from celery_app.cron_tasks.registration import (
    GLOBAL_TENANT,
    WINDOW,
    CronTask,
    Instant,
    window_id,
)
from celery_app.cron_tasks.runtime import runtime_store
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.cron_tasks.task_sources import all_tasks, paused_code_tasks
from celery_app.cron_tasks.tenants_provider import TenantsSource, read_tenants, resolve_tenants
from celery_app.errors import CheckbeatError
from celery_app.factory import settings_of
from celery_app.findings import Finding, FindingKind
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import (
    CRON_FINISHED,
    CronGapField,
    CronOutcome,
    CronSkipReason,
    CronSource,
    CronStateField,
    CronStatsField,
)
from celery_app.wall_clock import clock_from_env

#: Recorded gaps older than this are history, not a finding.
GAP_REPORT_WINDOW_S = 3600.0


class CronUsageError(CheckbeatError, ValueError):
    """A CLI request that cannot be honoured (unknown id, missing tenant, ...)."""


@dataclass(frozen=True)
class TaskRow:
    id: str
    name: str  # as declared (an add_periodic_task entry's name may not be a valid id)
    source: str  # @cron, beat_schedule or runtime
    task: str  # the Celery task name
    spec: str
    timezone: str
    scope: str
    singleton: bool
    timeout_s: float | None  # the soft (else hard) time limit a run gets; None: no limit
    grace_s: float
    overlap: str
    next_fire: str | None
    last_window: str | None
    last_start: str | None
    last_end: str | None
    last_outcome: str | None
    last_error: str | None
    fired: int
    skipped: int
    failed: int
    paused: bool = False  # paused (schedule pause): listed, never fired
    runs_recorded: bool = True  # False: no live worker records runs (last_* stay empty)


@dataclass(frozen=True)
class RunNowResult:
    """What a run-now did. ``publish_error`` is the broker's exception when the window was
    claimed but could not be sent (recorded as send-failed, never retried)."""

    sent: bool
    task_id: str
    tenant: str
    window: str
    message: str
    celery_id: str | None = None
    publish_error: BaseException | None = None


@dataclass(frozen=True)
class RunWait:
    """What ``run --wait`` learnt: ``outcome`` a :class:`CronOutcome` value or ``unknown``;
    ``source`` where it came from (``recorded``, ``result backend``, or ``none``)."""

    outcome: str
    detail: str = ""
    source: str = "recorded"

    @property
    def known(self) -> bool:
        return self.outcome != UNKNOWN


#: The least time a forced run-now's message may wait for a worker before it expires.
FORCED_MIN_GRACE = timedelta(minutes=1)
#: The outcome of a run that could not be learnt (no record, no result backend, or too late).
UNKNOWN = "unknown"
#: How long ``run --wait`` waits for a recording worker to show up when nothing else could
#: tell the outcome (a worker starting now marks itself at once), before it says so.
NO_RECORDER_WAIT_S = 20.0
_BACKEND_OUTCOME = {
    states.SUCCESS: CronOutcome.SUCCESS,
    states.FAILURE: CronOutcome.FAILURE,
    states.REVOKED: CronOutcome.REVOKED,
}


def applied_timeout(app: Celery, task: CronTask) -> float | None:
    """The time limit a run of ``task`` gets, in seconds (the soft one, else the hard one):
    the task's ``timeout`` for ``@cron`` and runtime tasks, which their messages carry; for a
    ``beat_schedule`` entry, what Celery applies, as under its own beat (the entry's options,
    else the task's own limits from ``task_time_limit`` / annotations); None: no limit."""
    if task.source != CronSource.BEAT_SCHEDULE:
        return task.soft_time_limit
    for option in ("soft_time_limit", "time_limit"):
        if task.options.get(option):
            return float(task.options[option])
    registered = app.tasks.get(task.name)
    if registered is not None:
        soft, hard = registered.soft_time_limit, registered.time_limit
    else:
        soft, hard = app.conf.task_soft_time_limit, app.conf.task_time_limit
    limit = soft or hard
    return float(limit) if limit else None


def _subject(task_id: str, tenant: str) -> str:
    """A finding's subject: the task, or ``task|tenant`` for one tenant's runs."""
    return task_id if tenant == GLOBAL_TENANT else f"{task_id}|{tenant}"


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _iso(ts: str | float | None) -> str | None:
    if ts in (None, ""):
        return None
    return datetime.fromtimestamp(float(ts), UTC).isoformat(timespec="seconds")


class CronService:
    """One app's cron tasks plus their Redis state."""

    def __init__(self, app: Celery, clock: Callable[[], datetime] | None = None) -> None:
        self.app = app
        self.settings = settings_of(app)
        self.clock = clock or clock_from_env().now
        self.keys = state_keys(self.settings)
        self.store = CronStore(
            get_redis(self.settings.redis_url, self.settings), self.keys, self.settings.cron_grace
        )
        self.runtime = runtime_store(app)
        self.tasks = self.store.anchored(all_tasks(app, self.runtime))
        self.tenants: TenantsSource | None = resolve_tenants(app)
        self._recorders: list[str] | None = None

    def recording_workers(self) -> list[str]:
        """The workers that record cron runs now (read once per service)."""
        if self._recorders is None:
            # Real time, as the workers write it (the service's clock may be a test clock).
            self._recorders = recorders.live(self.store.client, self.keys, time.time())
        return self._recorders

    # --- list ---------------------------------------------------------------------------
    def rows(self, now: datetime | None = None) -> list[TaskRow]:
        now = now or self.clock()
        paused = {
            s.id: s.as_task(self.settings.timezone)
            for s in self.runtime.schedules()
            if s.paused and s.id not in self.tasks
        }
        paused.update(paused_code_tasks(self.app, self.runtime))
        listed = dict(sorted({**self.tasks, **paused}.items()))
        recorded = bool(self.recording_workers())
        stats = self.store.stats(list(listed))
        # a schedule without a fixed grid says when it is next due from its shared last run
        last_runs = self.store.read_refs([t for t in listed.values() if t.is_custom])
        rows = []
        for task in listed.values():
            is_paused = task.id in paused
            s = stats.get(task.id, {})
            outcome = s.get(CronStatsField.LAST_OUTCOME)
            nxt = None if is_paused else task.next_fire(now)
            if task.id in last_runs and not is_paused:
                last = datetime.fromtimestamp(float(last_runs[task.id]), UTC)
                nxt = task.schedule.next_after(last)
            # Seconds where a minute would hide them (a 10 s interval, a 90 s one's :30).
            whole_minutes = task.window_length >= WINDOW and nxt is not None and not nxt.second
            rows.append(
                TaskRow(
                    id=task.id,
                    name=task.display_name,
                    source=str(task.source),
                    task=task.name,
                    spec=task.spec,
                    timezone=task.timezone,
                    scope=task.scope,
                    singleton=task.singleton,
                    timeout_s=applied_timeout(self.app, task),
                    grace_s=task.grace_or(self.settings.cron_grace).total_seconds(),
                    overlap=str(task.overlap),
                    next_fire=nxt.astimezone(task.zone).isoformat(
                        timespec="minutes" if whole_minutes else "seconds"
                    )
                    if nxt
                    else None,
                    last_window=_iso(s.get(CronStatsField.LAST_WINDOW)),
                    last_start=_iso(s.get(CronStatsField.LAST_START)),
                    last_end=_iso(s.get(CronStatsField.LAST_END)),
                    last_outcome=outcome,
                    last_error=s.get(CronStatsField.LAST_ERROR)
                    if outcome != CronOutcome.SUCCESS
                    else None,
                    fired=int(s.get(CronStatsField.FIRED, 0)),
                    skipped=int(s.get(CronStatsField.SKIPPED, 0)),
                    failed=int(s.get(CronStatsField.FAILED, 0)),
                    paused=is_paused,
                    runs_recorded=recorded,
                )
            )
        return rows

    # --- run now --------------------------------------------------------------------------
    def resolve(self, task_id: str, tenant: str | None) -> tuple[CronTask, str]:
        task = self.tasks.get(task_id)
        if task is None and self._is_paused(task_id):
            raise CronUsageError(
                f"cron task {task_id!r} is paused: `schedule resume {task_id}` first"
            )
        if task is None:
            known = ", ".join(self.tasks) or "none"
            raise CronUsageError(f"unknown cron task {task_id!r} (known: {known})")
        if not task.per_tenant:
            if tenant is not None:
                raise CronUsageError(f"cron task {task_id!r} is not per-tenant: drop --tenant")
            return task, GLOBAL_TENANT
        if tenant is None:
            raise CronUsageError(f"cron task {task_id!r} is per-tenant: pass --tenant NAME")
        if self.tenants is None:
            raise CronUsageError(
                f"cron task {task_id!r} is per-tenant but no tenants provider is configured "
                "(CHECKBEAT_TENANTS_PROVIDER=none)"
            )
        active = read_tenants(self.tenants)
        if tenant not in active:
            raise CronUsageError(
                f"tenant {tenant!r} is not an active tenant (provider: {self.tenants.describe}; "
                f"{len(active)} active)"
            )
        return task, tenant

    def _is_paused(self, task_id: str) -> bool:
        schedule = self.runtime.get(task_id)
        if schedule is not None:
            return schedule.paused
        return task_id in self.runtime.paused_ids()

    def run_now(
        self, task_id: str, tenant: str | None = None, *, force: bool = False
    ) -> RunNowResult:
        """Fire one task now through the window lock; refuse (sent=False) if it is taken,
        unless ``force``: then it runs as a manual run of its own (see the module docstring)."""
        task, tenant_name = self.resolve(task_id, tenant)
        now = self.clock()
        req = FireRequest(task, tenant_name, task.window_of(now))
        owner = f"manual:{socket.gethostname()}:{os.getpid()}"
        sender = CronPublisher(self.app, self.settings.cron_grace)
        taken: FireRequest | None = None  # the window a forced run stepped around
        try:
            firing = fire(self.store, sender, [req], now=now, owner=owner, manual=True)
            refused = not firing.fired and firing.error is None
            if force and refused:
                taken, req = req, self._forced_request(task, tenant_name, now)
                firing = fire(self.store, sender, [req], now=now, owner=owner, manual=True)
        finally:
            sender.close()
        if firing.fired:
            how = f"for window {req.window_id}"
            if taken is not None:
                how = (
                    f"as a forced run {req.window_id} (window {taken.window_id} was already taken)"
                )
            message = f"sent {task.id!r} (tenant {tenant_name}) {how}"
            return RunNowResult(
                True, task.id, tenant_name, req.window_id, message, firing.celery_ids[0]
            )
        ((_, reason),) = firing.skipped
        if reason == CronSkipReason.IN_FLIGHT and not self.recording_workers():
            left = self.store.client.pttl(self.keys.cron_inflight(task.id, tenant_name))
            why = (
                f"the previous run of {task.id!r} may still be in flight: its end is not "
                "recorded (workers do not run checkbeat's recording), so its mark holds "
                f"{max(left, 0) / 1000:.0f}s more (recorded as skipped)"
            )
        elif reason == CronSkipReason.IN_FLIGHT:
            why = f"the previous run of {task.id!r} is still in flight (recorded as skipped)"
        elif reason == CronSkipReason.SEND_FAILED:
            why = f"{firing.error} (recorded; window {req.window_id} is not retried)"
        else:
            who = self.store.window_owner(task.id, tenant_name, req.window_id) or "another run"
            why = f"window {req.window_id} of {task.id!r} was already fired by {who}"
        if not force and reason != CronSkipReason.SEND_FAILED:
            why += "; `schedule run --force` runs it now anyway"
        return RunNowResult(
            False, task.id, tenant_name, req.window_id, f"not sent: {why}", None, firing.cause
        )

    def _forced_request(self, task: CronTask, tenant: str, now: datetime) -> FireRequest:
        """A run of its own at ``now``: the task as a one-off non-singleton (no window key, no
        in-flight key) whose window is the instant itself, named to the microsecond. Its
        message may wait for a worker as long as the task's grace, and at least a minute (a
        grace of 0 would expire it as it is sent)."""
        at = now.astimezone(UTC)
        if not at.microsecond:
            at = at.replace(microsecond=1)  # a whole second may be an interval's window
        grace = max(task.grace_or(self.settings.cron_grace), FORCED_MIN_GRACE)
        one_off = replace(task, schedule=Instant(), singleton=False, grace=grace)
        return FireRequest(one_off, tenant, at)

    def result_backend(self) -> Any | None:
        """The app's Celery result backend, or None when it has none."""
        backend = self.app.backend
        return None if isinstance(backend, DisabledBackend) else backend

    def wait_for_run(self, result: RunNowResult, timeout: float) -> RunWait:
        """The outcome of a sent run, within ``timeout`` seconds: the run's record when a
        worker records it, else the result backend's state of its Celery id; ``unknown`` (and
        why) when neither tells by then, at once when neither ever can."""
        backend = self.result_backend()
        recorded = bool(self.recording_workers())
        started = time.monotonic()
        deadline = started + timeout
        # Nothing can tell yet: a recording worker that is starting says so within this.
        blind_until = started + min(timeout, NO_RECORDER_WAIT_S)
        key = (result.task_id, result.tenant)
        celery_id = cast(str, result.celery_id)  # only a sent run is waited for: it has one
        async_result = None if backend is None else self.app.AsyncResult(celery_id)
        while True:
            if not recorded and backend is None:
                self._recorders = None
                recorded = bool(self.recording_workers())
                if not recorded and time.monotonic() > blind_until:
                    return RunWait(
                        UNKNOWN,
                        "no live worker records cron runs and the app has no result backend, "
                        f"so the outcome cannot be known; to know it, {recorders.HOW_TO_RECORD}"
                        ", or configure a result_backend",
                        "none",
                    )
            state = self.store.states([key])[key]
            outcome = state.get(CronStateField.OUTCOME)
            ran = state.get(CronStateField.LAST_RUN_WINDOW) == result.window
            if (ran and outcome in CRON_FINISHED) or outcome == CronOutcome.SEND_FAILED:
                error = state.get(CronStateField.LAST_ERROR, "")
                return RunWait(str(outcome), "" if outcome == CronOutcome.SUCCESS else error)
            if async_result is not None:
                backend_state = async_result.state
                if backend_state in states.READY_STATES:
                    found = _BACKEND_OUTCOME.get(backend_state, backend_state.lower())
                    error = "" if backend_state == states.SUCCESS else repr(async_result.result)
                    return RunWait(str(found), error, "result backend")
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if ran and outcome == CronOutcome.RUNNING:
            since = _iso(state.get(CronStateField.LAST_START))
            known = f"it started at {since} and has not ended"
        elif recorded:
            known = "no worker recorded its start"
        else:
            known = "no live worker records cron runs"
        if async_result is not None:
            known += f"; the result backend says {async_result.state}"
        return RunWait(UNKNOWN, f"no outcome within {timeout:g}s: {known}", "none")

    # --- diagnose -------------------------------------------------------------------------
    def diagnose(self, now: datetime | None = None) -> list[Finding]:
        """Everything an operator must look at; empty means healthy."""
        now = now or self.clock()
        findings: list[Finding] = []
        findings += self._beat_findings(now)
        findings += self._provider_findings()
        findings += self._overdue_findings(now)
        findings += self._failing_findings()
        findings += self._pending_findings(now)
        findings += self._gap_findings(now)
        states = self._states()
        findings += self._skip_findings(now, states)
        if self.recording_workers():
            findings += self._unstarted_findings(now, states)
        return findings

    def notes(self, now: datetime | None = None) -> list[str]:
        """What diagnose cannot judge, said as such (not findings: exit 0 stays healthy). On
        workers that do not record runs, a fired window with no recorded start is no loss:
        whether it ran is simply not recorded."""
        if self.recording_workers():
            return []
        now = now or self.clock()
        notes = [
            "runs are not recorded: no live worker runs checkbeat's recording, so LAST RUN and "
            "OUTCOME stay empty and a fired window cannot be checked for a start; to record "
            f"them, {recorders.HOW_TO_RECORD}"
        ]
        notes += [f.message for f in self._unstarted_findings(now, self._states(), recorded=False)]
        return notes

    def _unstarted_findings(
        self,
        now: datetime,
        states: dict[tuple[str, str], dict[str, str]],
        *,
        recorded: bool = True,
    ) -> list[Finding]:
        """Windows fired for a (task, tenant) that no worker started by their deadline: the
        message was lost (a broker failover before replication, a flushed queue) or expired
        unconsumed. The window key says it fired, so it is not sent again (that could run it
        twice). Looked at: the window a singleton's in-flight key still holds (a lost run never
        releases it, so later windows are skipped behind it) and the last window fired."""
        held = self.store.inflight_windows(list(states))
        findings = []
        for pair, state in states.items():
            task_id, tenant = pair
            task = self.tasks[task_id]
            fired: dict[str, datetime] = {}
            last = state.get(CronStateField.LAST_WINDOW)
            if (
                last
                and state.get(CronStateField.LAST_SENT_AT)
                and state.get(CronStateField.LAST_SKIP_WINDOW) != last
            ):
                window = datetime.fromtimestamp(float(last), UTC)
                fired[task.window_id_of(window)] = window
            if pair in held:
                with contextlib.suppress(ValueError):  # a value another version wrote
                    fired[held[pair]] = parse_window_id(held[pair])
            for wid, window in sorted(fired.items()):
                if state.get(CronStateField.LAST_RUN_WINDOW) == wid:
                    continue
                deadline = task_deadline(task, window, self.settings.cron_grace)
                late = (now - deadline).total_seconds()
                if late <= 0 or late > GAP_REPORT_WINDOW_S:
                    continue
                where = "" if tenant == GLOBAL_TENANT else f" (tenant {tenant})"
                subject = _subject(task_id, tenant)
                if not recorded:
                    message = (
                        f"task {task_id!r}{where}: window {wid} was fired; its run is not "
                        "recorded (workers do not run checkbeat's recording)"
                    )
                    findings.append(Finding(FindingKind.NEVER_STARTED, subject, message, window))
                    continue
                why = (
                    "its message expired before a worker took it"
                    if state.get(CronStateField.OUTCOME) == CronOutcome.EXPIRED
                    and f"(window {wid})" in state.get(CronStateField.LAST_ERROR, "")
                    else "no worker ever received its message (lost with the broker?)"
                )
                message = (
                    f"task {task_id!r}{where}: window {wid} was fired but never started by its "
                    f"deadline {deadline.isoformat(timespec='seconds')}: {why}"
                )
                findings.append(Finding(FindingKind.NEVER_STARTED, subject, message, window))
        return findings

    def _states(self) -> dict[tuple[str, str], dict[str, str]]:
        """The state hash of every (task, tenant) that fires: the global tenant of a task, or
        each active tenant of a per-tenant one (none when the provider fails: it is named)."""
        pairs: list[tuple[str, str]] = []
        tenants: list[str] | None = None
        for task in self.tasks.values():
            if not task.per_tenant:
                pairs.append((task.id, GLOBAL_TENANT))
                continue
            if self.tenants is None:
                continue
            if tenants is None:
                try:
                    tenants = list(read_tenants(self.tenants))
                except Exception:
                    tenants = []  # _provider_findings names the failure
            pairs += [(task.id, tenant) for tenant in tenants]
        return dict(sorted(self.store.states(pairs).items()))

    def _skip_findings(
        self, now: datetime, states: dict[tuple[str, str], dict[str, str]]
    ) -> list[Finding]:
        """Windows the overlap policy skipped (the previous run still in flight): not fired
        either, so named here; the state keeps the last one per (task, tenant) and a count."""
        findings = []
        why = "the previous run was still in flight"
        if not self.recording_workers():
            why = (
                "the previous run's end is not recorded (workers do not run checkbeat's "
                "recording), so its in-flight mark holds until its time limit; "
                f"use overlap allow, or {recorders.HOW_TO_RECORD}"
            )
        for (task_id, tenant), state in states.items():
            skipped_at = state.get(CronStateField.LAST_SKIP_WINDOW)
            if state.get(CronStateField.LAST_SKIP_REASON) != CronSkipReason.IN_FLIGHT:
                continue
            if not skipped_at or now.timestamp() - float(skipped_at) > GAP_REPORT_WINDOW_S:
                continue
            window = datetime.fromtimestamp(float(skipped_at), UTC)
            where = "" if tenant == GLOBAL_TENANT else f" (tenant {tenant})"
            total = state.get(CronStateField.SKIPPED, "1")
            message = (
                f"task {task_id!r}{where}: window {self.tasks[task_id].window_id_of(window)} "
                f"was skipped, not fired: {why} ({total} skipped in all)"
            )
            findings.append(
                Finding(FindingKind.SKIPPED, _subject(task_id, tenant), message, window)
            )
        return findings

    def _beat_findings(self, now: datetime) -> list[Finding]:
        beats = self.store.heartbeats()
        stale = self.settings.beat_heartbeat_stale.total_seconds()
        live = [b for b, ts in beats.items() if now.timestamp() - ts <= stale]
        if live:
            return []
        stopped = self.store.stopped_beats()
        last = max(beats.values(), default=0.0)
        if stopped and max(stopped.values()) >= last:
            beat, at = max(stopped.items(), key=lambda item: item[1])
            message = f"no live beat: the last beat ({beat}) stopped at {_iso(at)}"
            return [Finding(FindingKind.NO_LIVE_BEAT, beat, message, _at(at))]
        if not beats:
            message = "no live beat: no beat heartbeat was ever recorded"
            return [Finding(FindingKind.NO_LIVE_BEAT, "beat", message)]
        message = (
            f"no live beat: the last heartbeat was {now.timestamp() - last:.0f}s ago "
            f"(stale after {stale:.0f}s)"
        )
        beat = max(beats, key=beats.__getitem__)
        return [Finding(FindingKind.NO_LIVE_BEAT, beat, message, _at(last))]

    def _provider_findings(self) -> list[Finding]:
        per_tenant = [t.id for t in self.tasks.values() if t.per_tenant]
        if not per_tenant:
            return []
        if self.tenants is None:
            return [
                Finding(
                    FindingKind.NO_TENANTS_PROVIDER,
                    tid,
                    f"per-tenant task {tid!r} does not fire: no tenants provider "
                    "(CHECKBEAT_TENANTS_PROVIDER=none)",
                )
                for tid in per_tenant
            ]
        try:
            read_tenants(self.tenants)
        except Exception as exc:
            message = (
                f"tenants provider {self.tenants.describe} fails: {exc}; per-tenant tasks "
                f"{', '.join(per_tenant)} do not fire"
            )
            return [Finding(FindingKind.TENANTS_PROVIDER_FAILS, self.tenants.describe, message)]
        return []

    def _overdue_findings(self, now: datetime) -> list[Finding]:
        findings = []
        grace = self.settings.cron_grace
        stats = self.store.stats(list(self.tasks))
        refs = self.store.read_refs(list(self.tasks.values()))
        for task in self.tasks.values():
            if task.per_tenant and self.tenants is None:
                continue
            s = stats.get(task.id, {})
            last_window = s.get(CronStatsField.LAST_WINDOW)
            first_seen = s.get(CronStatsField.FIRST_SEEN)
            if last_window:
                handled = datetime.fromtimestamp(float(last_window), UTC)
                base = handled + task.window_length
                since = f"last handled window {task.window_id_of(handled)}"
            elif first_seen:
                base = datetime.fromtimestamp(float(first_seen), UTC)
                ref = refs.get(task.id)
                if ref is not None:  # its first window is the first one after first sight
                    seen = datetime.fromtimestamp(float(ref), UTC)
                    base = max(base, task.window_of(seen) + task.window_length)
                since = "never fired"
            else:
                continue
            expected = task.next_fire(base)
            deadline = None if expected is None else task_deadline(task, expected, grace)
            if expected is not None and deadline is not None and deadline < now:
                message = (
                    f"task {task.id!r} is overdue: window {task.window_id_of(expected)} passed "
                    "with no "
                    f"firing and no recorded skip ({since})"
                )
                findings.append(Finding(FindingKind.OVERDUE, task.id, message, expected))
        return findings

    def _failing_findings(self) -> list[Finding]:
        findings = []
        for member, error in sorted(self.store.failing().items()):
            task_id, _, tenant = member.partition("|")
            where = "" if tenant == GLOBAL_TENANT else f" (tenant {tenant})"
            message = f"task {task_id!r}{where}: last run failed: {error}"
            findings.append(Finding(FindingKind.FAILING, _subject(task_id, tenant), message))
        return findings

    def _pending_findings(self, now: datetime) -> list[Finding]:
        cutoff = now - WINDOW - self.settings.cron_grace
        findings = []
        for member in self.store.lost_claims(cutoff):
            task_id, tenant, wid = split_member(member)
            where = "" if tenant == GLOBAL_TENANT else f" (tenant {tenant})"
            message = (
                f"task {task_id!r}{where}: window {wid} was claimed but its publish was never "
                "confirmed (a beat died mid-window?); it was not fired again"
            )
            since = None
            with contextlib.suppress(ValueError):  # a value another version wrote
                since = parse_window_id(wid)
            findings.append(
                Finding(FindingKind.UNCONFIRMED, _subject(task_id, tenant), message, since)
            )
        return findings

    def _gap_findings(self, now: datetime) -> list[Finding]:
        findings = []
        for gap in self.store.gaps():
            if now.timestamp() - float(gap[CronGapField.DETECTED_AT]) > GAP_REPORT_WINDOW_S:
                continue
            start = datetime.fromtimestamp(gap[CronGapField.FROM], UTC)
            end = datetime.fromtimestamp(gap[CronGapField.TO], UTC)
            task = self.tasks.get(gap[CronGapField.TASK])
            name = window_id if task is None else task.window_id_of  # an interval's seconds
            tenant = gap.get(CronGapField.TENANT)
            where = "" if tenant in (None, GLOBAL_TENANT) else f" (tenant {tenant})"
            count = gap.get(CronGapField.COUNT)
            many = f" ({count} window{'s' if count != 1 else ''})" if count else ""
            note = f"; {gap[CronGapField.NOTE]}" if gap.get(CronGapField.NOTE) else ""
            message = (
                f"task {gap[CronGapField.TASK]!r}{where}: windows from {name(start)} to "
                f"before {name(end)}{many} were not fired ({gap[CronGapField.DETECTOR]}"
                f"{note})"
            )
            subject = _subject(gap[CronGapField.TASK], tenant or GLOBAL_TENANT)
            findings.append(Finding(FindingKind.NOT_FIRED, subject, message, start))
        return findings


def row_dict(row: TaskRow) -> dict[str, Any]:
    return asdict(row)
