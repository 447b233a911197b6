"""The cron engine: which (task, tenant) pairs fire in a window, exactly once across replicas.

Why a heap of next-fire instants: with 10,000 tasks, a tick with nothing due must cost almost
nothing, so each task's next window is computed once (``CronTask.next_fire``) and a tick only
looks at the heap's top. What is due goes through one claim round trip (the per-window
``SET NX`` keys, see :mod:`celery_app.cron_tasks.store`) and one publish batch.

Windows a running engine slept through are fired late while their grace lasts; older ones are
recorded as gaps for ``schedule diagnose``. When several windows of one task are due in one
tick, only the newest fires (the older are ``superseded``).

Where a new engine starts: singletons at the oldest window whose grace has not passed, so a
window a killed beat never claimed is fired late instead of lost; a window another engine already
handled is offered again and its window key answers ``taken`` (it never runs twice).
Non-singletons have no window key, so they start at the current window: re-offering one would
run it twice.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from celery_app.cron_tasks.firing import Sender, fire
from celery_app.cron_tasks.registration import GLOBAL_TENANT, WINDOW, CronTask, window_start
from celery_app.cron_tasks.store import CronStore, FireRequest
from celery_app.cron_tasks.tenants import TenantsSource, read_tenants
from celery_app.redis.schema import CronSkipReason, CronStatsField
from scheduling_core._time import require_aware

log = logging.getLogger(__name__)

ALL_TENANTS = "*"
_UNSET = object()


@dataclass(frozen=True)
class Fired:
    task_id: str
    tenant: str
    window: datetime


@dataclass(frozen=True)
class Skipped:
    """Not sent by this engine, and why (see :class:`CronSkipReason`)."""

    task_id: str
    tenant: str
    window: datetime
    reason: CronSkipReason


@dataclass(frozen=True)
class TickReport:
    at: datetime
    fired: tuple[Fired, ...] = ()
    skipped: tuple[Skipped, ...] = ()


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class CronEngine:
    """Fires the due cron tasks of each window through a store (the lock) and a sender."""

    def __init__(
        self,
        tasks: Iterable[CronTask],
        store: CronStore,
        sender: Sender,
        tenants: TenantsSource | None,
        *,
        grace: timedelta,
        owner: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        start: datetime | None = None,
    ) -> None:
        self.tasks: tuple[CronTask, ...] = tuple(tasks)
        self.store = store
        self.sender = sender
        self.tenants = tenants
        self.grace = grace
        self.owner = owner
        self.clock = clock
        start = require_aware(start or clock(), "start")
        first = window_start(start)
        # Singletons start at the oldest window whose grace has not passed: the window keys
        # make re-offering a window another beat already fired harmless, and a window a killed
        # beat claimed nothing of is fired late instead of lost. Non-singletons have no key, so
        # they start at the current window.
        self._start = start
        self._first_window = first
        self._announced = False
        self._missed_tasks: dict[str, CronTask] = {}
        self._starts: list[datetime] = []
        self._heap: list[tuple[float, int]] = []
        for index, task in enumerate(self.tasks):
            begin = self._begin_of(task, start)
            self._starts.append(begin)
            when = task.next_fire(begin)
            if when is not None:
                self._heap.append((when.timestamp(), index))
        heapq.heapify(self._heap)
        self._timing = self._timing_of(self.tasks)

    def _timing_of(self, tasks: tuple[CronTask, ...]) -> list[tuple[float, float]]:
        """Per task index: (window length, grace) in seconds, read once, not per tick."""
        return [
            (t.window_length.total_seconds(), t.grace_or(self.grace).total_seconds()) for t in tasks
        ]

    def _begin_of(self, task: CronTask, start: datetime) -> datetime:
        """Where ``task`` starts: see the module docstring (windows of the task's own length,
        grace of its own)."""
        if not task.singleton:
            return _window_of(task, start)
        length = task.window_length
        return _window_of(task, start - length - task.grace_or(self.grace)) + length

    def set_tasks(self, tasks: Iterable[CronTask], at: datetime | None = None) -> None:
        """Replace the task list (runtime schedules changed): a task whose id and definition
        are unchanged keeps its place in the heap; a new or changed one starts as a new
        engine's would, at ``at``. Takes effect at the next tick."""
        at = require_aware(at, "at") if at is not None else self.clock()
        new_tasks = tuple(tasks)
        old_index = {task.id: index for index, task in enumerate(self.tasks)}
        pending = {index: ts for ts, index in self._heap}
        heap: list[tuple[float, int]] = []
        starts: list[datetime] = []
        fresh: list[CronTask] = []
        for index, task in enumerate(new_tasks):
            old = old_index.get(task.id)
            if old is not None and _same_definition(self.tasks[old], task):
                starts.append(self._starts[old])
                if old in pending:
                    heap.append((pending[old], index))
                continue
            begin = self._begin_of(task, at)
            starts.append(begin)
            fresh.append(task)
            when = task.next_fire(begin)
            if when is not None:
                heap.append((when.timestamp(), index))
        heapq.heapify(heap)
        self.tasks, self._starts, self._heap = new_tasks, starts, heap
        self._timing = self._timing_of(new_tasks)
        if fresh and self._announced:
            self.store.note_first_seen(fresh, window_start(at))

    def next_due(self) -> datetime | None:
        """Start of the next window in which some task fires."""
        return _utc(self._heap[0][0]) if self._heap else None

    def tick(self, at: datetime | None = None) -> TickReport:
        """Fire everything due up to the window of ``at``; report what was fired and skipped.

        On an exception (Redis unreachable before anything was claimed) the engine is left as
        before the call, so the next tick retries the same windows while their grace lasts.
        """
        at = require_aware(at, "at") if at is not None else self.clock()
        now_ts = at.timestamp()
        # Heap entries are window starts, so "started by now" is "due".
        current_ts = now_ts
        heap = self._heap
        if self._announced and (not heap or heap[0][0] > current_ts):
            return TickReport(at)
        if not self._announced:
            self._announce(at)
        saved = list(heap)
        timing = self._timing
        missed: list[Skipped] = []
        superseded: list[Skipped] = []
        due_at: dict[int, float] = {}
        next_fires: dict[tuple[str, str, float], object] = {}
        while heap and heap[0][0] <= current_ts:
            ts, index = heapq.heappop(heap)
            task = self.tasks[index]
            length_s, grace_s = timing[index]
            resume = ts + length_s
            if now_ts >= ts + length_s + grace_s:
                missed.append(Skipped(task.id, ALL_TENANTS, _utc(ts), CronSkipReason.MISSED))
                self._missed_tasks[task.id] = task
                log.warning("cron: %s missed window %s (its grace has passed)", task.id, _utc(ts))
                # Skip straight to the oldest window whose grace has not passed.
                edge = now_ts - length_s - grace_s
                resume = max(resume, edge - edge % length_s + length_s)
            else:
                latest = due_at.get(index)
                if latest is not None:
                    # Two windows of one task due in one tick (a stall): run the newer only,
                    # or the older's in-flight key would make the newer one skip.
                    superseded.append(
                        Skipped(task.id, ALL_TENANTS, _utc(latest), CronSkipReason.SUPERSEDED)
                    )
                due_at[index] = ts
            # Tasks sharing a spec and zone share the answer: one next() per spec per tick.
            memo = (type(task.schedule), task.spec, task.timezone, resume)
            next_ts = next_fires.get(memo, _UNSET)
            if next_ts is _UNSET:
                when = task.next_fire(_utc(resume))
                next_ts = next_fires[memo] = None if when is None else when.timestamp()
            if next_ts is not None:
                heapq.heappush(heap, (next_ts, index))
        due: dict[float, list[CronTask]] = {}
        for index, ts in due_at.items():
            due.setdefault(ts, []).append(self.tasks[index])
        if missed:
            # Before firing: the gap script skips windows whose task already handled a later
            # one, and this tick's claims are about to move last_window past the missed ones.
            self._record_missed(missed, at)
        try:
            fired, skipped = self._fire(due, at)
        except BaseException:
            self._heap = saved
            raise
        return TickReport(at, tuple(fired), tuple(missed + superseded + skipped))

    def _record_missed(self, missed: list[Skipped], at: datetime) -> None:
        """Windows this engine slept through beyond their grace: a gap unless someone fired."""
        gaps = [
            (
                self._missed_tasks[m.task_id],
                m.window,
                m.window + self._missed_tasks[m.task_id].window_length,
            )
            for m in missed
            # Without a provider a per-tenant task never fires; diagnose says that instead.
            if not (self._missed_tasks[m.task_id].per_tenant and self.tenants is None)
        ]
        self._missed_tasks.clear()
        try:
            self.store.record_gaps(gaps, at, f"past their grace; found by {self.owner}")
        except Exception:
            log.exception("cron: could not record %d missed windows", len(gaps))

    def _announce(self, at: datetime) -> None:
        """First tick: note the tasks as seen, and record windows nobody fired while no beat
        was running (the last handled window's successor is older than where we start)."""
        stats = self.store.stats([task.id for task in self.tasks])
        gaps: list[tuple[CronTask, datetime, datetime]] = []
        for task, begin in zip(self.tasks, self._starts, strict=True):
            last = stats.get(task.id, {}).get(CronStatsField.LAST_WINDOW)
            if not last:
                continue
            expected = task.next_fire(_utc(float(last)) + task.window_length)
            if expected is not None and expected < begin:
                gaps.append((task, expected, begin))
        self.store.note_first_seen(self.tasks, self._first_window)
        if gaps:
            recorded = self.store.record_gaps(gaps, at, f"no beat ran them; found by {self.owner}")
            log.warning("cron: %d tasks have windows nobody fired before this beat", recorded)
        self._announced = True

    def _fire(
        self, due: dict[float, list[CronTask]], at: datetime
    ) -> tuple[list[Fired], list[Skipped]]:
        skipped: list[Skipped] = []
        requests: list[FireRequest] = []
        marks: list[tuple[CronTask, datetime]] = []
        tenants: list[str] | None = None
        tenants_error: str | None = None
        for ts in sorted(due):
            window = _utc(ts)
            for task in due[ts]:
                if not task.per_tenant:
                    requests.append(FireRequest(task, GLOBAL_TENANT, window))
                    continue
                if self.tenants is None:
                    skipped.append(
                        Skipped(task.id, ALL_TENANTS, window, CronSkipReason.NO_PROVIDER)
                    )
                    continue
                if tenants is None and tenants_error is None:
                    try:
                        tenants = read_tenants(self.tenants)
                    except Exception as exc:
                        tenants_error = f"{type(exc).__name__}: {exc}"
                        log.error(
                            "cron: tenants provider %s failed: %s", self.tenants.describe, exc
                        )
                if tenants_error is not None:
                    skipped.append(
                        Skipped(task.id, ALL_TENANTS, window, CronSkipReason.PROVIDER_FAILED)
                    )
                    continue
                marks.append((task, window))
                requests.extend(FireRequest(task, tenant, window) for tenant in tenants or ())
        if not requests and not marks:
            return [], skipped
        firing = fire(self.store, self.sender, requests, now=at, owner=self.owner, marks=marks)
        skipped.extend(Skipped(r.task.id, r.tenant, r.window, why) for r, why in firing.skipped)
        return [Fired(r.task.id, r.tenant, r.window) for r in firing.fired], skipped


def _window_of(task: CronTask, at: datetime) -> datetime:
    return task.window_of(at)


def _same_definition(old: CronTask, new: CronTask) -> bool:
    """Whether a reload may keep ``old``'s place: same fields (the dataclass equality) and the
    same schedule (its spec and kind)."""
    return old == new and type(old.schedule) is type(new.schedule)


__all__ = ["ALL_TENANTS", "WINDOW", "CronEngine", "Fired", "Sender", "Skipped", "TickReport"]
