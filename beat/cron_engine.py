"""The cron engine: which (task, tenant) pairs fire in a window, exactly once across replicas.

Why a heap of next-fire instants: with 10,000 tasks, a tick with nothing due must cost almost
nothing, so each task's next window is computed once (``CronTask.next_fire``) and a tick only
looks at the heap's top. What is due goes through one claim round trip (the per-window
``SET NX`` keys, see :mod:`celery_app.cron_tasks.cron_state`) and one publish batch.

Windows a running engine slept through (a stall, or a forward clock step) are fired late while
their grace lasts; older ones are recorded for ``schedule diagnose`` as one range per task (per
tenant of a per-tenant task) naming every missed window, never fired early or late. When several
windows of one task are due in one tick, only the newest fires (the older are ``superseded``).

A clock step: given a steady clock (``steady``, seconds that only move forward), the engine
notices the wall clock jumping ahead of it by more than the grace and keeps firing by the
steady clock for up to ``step_hold`` (a clock stepped +1 h and back fires nothing early); a step
that persists that long is accepted and the windows it skipped are recorded as gaps. After a
step back, windows already handled are not fired again: the heap has moved past them, and the
claim refuses a window older than the last one its (task, tenant) handled. A stall (a blocked
call, a long GC, SIGSTOP) moves the steady clock as much as the wall clock, so it is no step: its
windows are handled as above. That needs each wall time paired with a steady time read at the
same moment (:mod:`scheduling_core.clock_step`), which ``tick()`` without ``at`` does.

The lead: windows fire ``lead`` before their start (``CHECKBEAT_CRON_LEAD``; the worker waits
for the start on Redis's clock, :mod:`celery_app.cron_tasks.lead`), so a window is claimed, and
a singleton's in-flight key judged, that much before its start. A window is missed only once its
grace has passed by the clock itself, never because of the lead.

Where a new engine starts: singletons at the oldest window whose grace has not passed, so a
window a killed beat never claimed is fired late instead of lost; a window another engine already
handled is offered again and its window key answers ``taken`` (it never runs twice).
Non-singletons have no window key, so they start at the current window: re-offering one would
run it twice. Never before the first window that starts after the task's reference instant
(``Keys.cron_ref``: the first instant any beat saw the task with this schedule, written once and
read alike by every beat): a task no beat has seen yet (a first deployment, a new task, a changed
schedule) fires first at its next window start, as Celery's beat fires a new entry, and an
interval's windows are counted from that instant (``anchor + k*every``), so its firings are
beat's: ``every`` after it was first seen, then every ``every``.

Schedules without a fixed grid (``CronTask.is_custom``: solar, relative intervals, any
``BaseSchedule`` of the user's) are not in the heap: when their last answer says so, the engine
reads their shared last runs (one round trip), asks each ``is_due(last_run_at)`` as Celery's beat
does, and claims the due ones under a window named by that last run (``cron_claim.lua`` fires it
only while the last run is the one read, and moves it to the claim's time).
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, cast

from celery_app.cron_tasks.cron_state import CronStore, FireRequest, Gap, anchored
from celery_app.cron_tasks.firing import Sender, Takeover, fire, take_over_expired
from celery_app.cron_tasks.registration import (
    GLOBAL_TENANT,
    WINDOW,
    CronTask,
    interval_window_id,
    window_start,
)
from celery_app.cron_tasks.tenants_provider import TenantsSource, read_tenants
from celery_app.gc_pause import gc_paused
from celery_app.redis.schema import CronSkipReason, CronStatsField
from scheduling_core._time import require_aware
from scheduling_core.clock_step import Reading, StepVerdict, judge, pairs, wall_lead

log = logging.getLogger(__name__)

ALL_TENANTS = "*"
#: Missed windows counted per task and gap; a longer outage is recorded as an uncounted range.
MAX_COUNTED = 10_000
#: How long a forward clock step is distrusted (fired by the steady clock) before it is accepted.
STEP_HOLD = timedelta(hours=2)
#: Longest wait before a custom schedule is asked ``is_due`` again (Celery's beat_max_loop_interval
#: default): its own state (a database row, a flag) may change meanwhile.
CUSTOM_MAX_WAIT = 300.0
#: Shortest wait between two questions to one custom schedule.
CUSTOM_MIN_WAIT = 0.1
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
        steady: Callable[[], float] | None = None,
        step_hold: timedelta = STEP_HOLD,
        lead: timedelta = timedelta(0),
        custom_max_wait: float = CUSTOM_MAX_WAIT,
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
        self.steady = steady
        self.step_hold = step_hold
        #: How far ahead of its start a window fires (its worker waits for the start).
        self.lead = lead
        self._anchor: tuple[float, float] | None = None  # (wall, steady) of the last trusted tick
        self._step_since: float | None = None  # steady time a forward step was first seen
        self._step_note = ""
        self._announced = False
        self._unseen: set[str] = set()  # tasks no caller had handled when this engine started
        # (task, first window not fired, end, superseded only): recorded as gaps each tick
        self._missed: list[tuple[CronTask, float, float, bool]] = []
        #: Task id -> its reference instant as stored (``Keys.cron_ref``), read at the first tick.
        self._refs: dict[str, str] = {}
        self.custom_max_wait = custom_max_wait
        self._custom_next = -math.inf  # when a custom schedule is next asked is_due
        self._custom_at: dict[str, float] = {}  # per custom task: when it is next asked
        self._starts: list[datetime] = []
        self._heap: list[tuple[float, int]] = []
        self._place(start)

    def _place(self, start: datetime) -> None:
        """Every task's first window and the heap, from ``start`` and the references known."""
        self._starts, self._heap = [], []
        for index, task in enumerate(self.tasks):
            begin = self._begin_of(task, start, self._refs.get(task.id))
            self._starts.append(begin)
            when = task.next_fire(begin)
            if when is not None:
                self._heap.append((when.timestamp(), index))
        heapq.heapify(self._heap)
        self._timing = self._timing_of(self.tasks)
        self._custom = tuple(task for task in self.tasks if task.is_custom)

    def _timing_of(self, tasks: tuple[CronTask, ...]) -> list[tuple[float, float]]:
        """Per task index: (window length, grace) in seconds, read once, not per tick."""
        return [
            (t.window_length.total_seconds(), t.grace_or(self.grace).total_seconds()) for t in tasks
        ]

    def _begin_of(self, task: CronTask, start: datetime, ref: str | None = None) -> datetime:
        """Where ``task`` starts: see the module docstring (windows of the task's own length,
        grace of its own, never a window that began at or before its reference instant)."""
        length = task.window_length
        if not task.singleton:
            begin = _window_of(task, start)
        else:
            begin = _window_of(task, start - length - task.grace_or(self.grace)) + length
        if ref is not None:
            begin = max(begin, _window_of(task, _utc(float(ref))) + length)
        return begin

    def _anchored(self, task: CronTask) -> CronTask:
        """``task`` with its interval counted from its reference instant, when one is known."""
        return anchored(task, self._refs.get(task.id))

    def set_tasks(self, tasks: Iterable[CronTask], at: datetime | None = None) -> None:
        """Replace the task list (runtime schedules changed): a task whose id and definition
        are unchanged keeps its place in the heap; a new or changed one starts as a new
        engine's would, at ``at``. Takes effect at the next tick."""
        at = require_aware(at, "at") if at is not None else self.clock()
        new_tasks = tuple(tasks)
        old_index = {task.id: index for index, task in enumerate(self.tasks)}
        kept = {
            task.id
            for task in new_tasks
            if task.id in old_index and _same_definition(self.tasks[old_index[task.id]], task)
        }
        if self._announced:
            # Before anything changes: a failed read leaves the engine as it was.
            added = [task for task in new_tasks if task.id not in kept]
            self._refs.update(self.store.note_refs(added, at))
        new_tasks = tuple(self._anchored(task) for task in new_tasks)
        pending = {index: ts for ts, index in self._heap}
        heap: list[tuple[float, int]] = []
        starts: list[datetime] = []
        fresh: list[CronTask] = []
        for index, task in enumerate(new_tasks):
            old = old_index.get(task.id)
            if task.id in kept:
                starts.append(self._starts[cast(int, old)])  # kept: its id is in old_index
                if old in pending:
                    heap.append((pending[old], index))
                continue
            begin = self._begin_of(task, at, self._refs.get(task.id))
            starts.append(begin)
            fresh.append(task)
            when = task.next_fire(begin)
            if when is not None:
                heap.append((when.timestamp(), index))
        heapq.heapify(heap)
        self.tasks, self._starts, self._heap = new_tasks, starts, heap
        self._timing = self._timing_of(new_tasks)
        self._custom = tuple(task for task in new_tasks if task.is_custom)
        if any(task.is_custom for task in fresh):
            self._custom_next = -math.inf
        if fresh and self._announced:
            self.store.note_first_seen(fresh, window_start(at))

    def next_due(self) -> datetime | None:
        """Start of the next window in which some task fires (or when custom schedules are
        asked again, if sooner)."""
        when = self._heap[0][0] if self._heap else None
        if self._has_custom() and (when is None or self._custom_next < when):
            return _utc(max(self._custom_next, 0.0))
        return None if when is None else _utc(when)

    def next_fire(self) -> datetime | None:
        """When the next window fires: its start less the lead (custom schedules: no lead)."""
        when = self._heap[0][0] - self.lead.total_seconds() if self._heap else None
        if self._has_custom() and (when is None or self._custom_next < when):
            return _utc(max(self._custom_next, 0.0))
        return None if when is None else _utc(when)

    def _has_custom(self) -> bool:
        return bool(self._custom)

    def trusted(self, at: datetime, steady: float | None = None) -> datetime:
        """``at``, or while a forward clock step is held, the steady clock's idea of now
        (``steady``: the steady time read with ``at``; read now when not given)."""
        return self._trust(at, self._steady_at(steady))[0]

    def _steady_at(self, steady: float | None) -> float | None:
        return steady if steady is not None or self.steady is None else self.steady()

    def _read_clocks(self) -> tuple[datetime, float | None]:
        """(wall, steady) read at one moment: a wall time read before a stall (a blocked call,
        SIGSTOP) paired with a steady time read after it would look like a forward clock step
        of the stall's length, so the pair is read again until nothing came between."""
        if self.steady is None:
            return require_aware(self.clock(), "clock()"), None
        for _ in range(3):
            before = self.steady()
            wall = require_aware(self.clock(), "clock()")
            after = self.steady()
            if pairs(before, after):
                break
        return wall, before

    def _trust(self, at: datetime, steady: float | None) -> tuple[datetime, float | None, bool]:
        """(time to fire by, steady now, whether a forward step is being held)."""
        if steady is None or self._anchor is None:
            return at, steady, False
        anchor = Reading(*self._anchor)
        lead = wall_lead(anchor, Reading(at.timestamp(), steady))
        held_for = None if self._step_since is None else steady - self._step_since
        verdict = judge(lead, self.grace.total_seconds(), held_for, self.step_hold.total_seconds())
        if verdict is StepVerdict.HOLD:
            return _utc(anchor.wall + (steady - anchor.steady)), steady, True
        return at, steady, False

    def _follow_clock(self, at: datetime, steady: float | None) -> datetime:
        """Detect and hold forward clock steps (see the module docstring); return the time
        this tick fires by. A stall moves both clocks alike: it is no step."""
        trusted, steady, held = self._trust(at, steady)
        if steady is None:
            return at
        if held:
            if self._step_since is None:
                self._step_since = steady
                log.warning(
                    "cron: the clock jumped %.0fs ahead of the steady clock; firing by the steady "
                    "clock for up to %s",
                    (at - trusted).total_seconds(),
                    self.step_hold,
                )
            return trusted
        if self._step_since is not None and self._anchor is not None:
            ahead = wall_lead(Reading(*self._anchor), Reading(at.timestamp(), steady))
            if ahead > self.grace.total_seconds():
                self._step_note = f"clock stepped forward {ahead:.0f}s; "
                log.warning("cron: the clock step persisted %s: following it", self.step_hold)
            else:
                log.warning("cron: the clock is back in step with the steady clock")
        self._step_since = None
        self._anchor = (at.timestamp(), steady)
        return at

    def tick(self, at: datetime | None = None, steady: float | None = None) -> TickReport:
        """Fire everything due up to the window of ``at``; report what was fired and skipped.

        Without ``at`` the engine reads its wall and steady clocks together (what beat does);
        a caller giving ``at`` gives the ``steady`` time read with it, or it is read now.

        On an exception (Redis unreachable before anything was claimed) the engine is left as
        before the call, so the next tick retries the same windows while their grace lasts.
        """
        if at is None:
            at, steady = self._read_clocks()
        else:
            at, steady = require_aware(at, "at"), self._steady_at(steady)
        at = self._follow_clock(at, steady)
        now_ts = at.timestamp()
        # Heap entries are window starts, so "starts within the lead" is "due". A window fired
        # ahead is not late: missed and grace are judged by ``now_ts`` itself.
        current_ts = now_ts + self.lead.total_seconds()
        if not self._announced:
            self._announce(at)
        custom = self._custom_requests(at) if now_ts >= self._custom_next else []
        heap = self._heap
        if not custom and (not heap or heap[0][0] > current_ts):
            return TickReport(at)
        # A due window allocates a few objects per task that all live until the tick ends: a
        # collection in the middle would find nothing to free and scan them and every task the
        # engine holds (a full one per tick at ten thousand tasks). Reference counting still
        # frees everything dropped; the collector runs again once the tick is over.
        with gc_paused():
            return self._fire_due(at, now_ts, current_ts, custom)

    def _fire_due(
        self, at: datetime, now_ts: float, current_ts: float, custom: list[FireRequest]
    ) -> TickReport:
        """The due part of :meth:`tick`: pop what is due, claim, publish, re-heap."""
        heap = self._heap
        saved = list(heap)
        timing = self._timing
        missed: list[Skipped] = []
        superseded: list[Skipped] = []
        due_at: dict[int, float] = {}
        next_fires: dict[tuple[type, str, str, datetime | None, float], object] = {}
        while heap and heap[0][0] <= current_ts:
            ts, index = heapq.heappop(heap)
            task = self.tasks[index]
            length_s, grace_s = timing[index]
            resume = ts + length_s
            if now_ts >= ts + length_s + grace_s:
                missed.append(Skipped(task.id, ALL_TENANTS, _utc(ts), CronSkipReason.MISSED))
                # Skip straight to the oldest window whose grace has not passed; every window
                # in between is part of the gap.
                edge = _window_of(task, _utc(now_ts - length_s - grace_s)).timestamp()
                resume = max(resume, edge + length_s)
                self._missed.append((task, ts, resume, False))
                log.warning(
                    "cron: %s missed windows from %s to before %s (their grace has passed)",
                    task.id,
                    _utc(ts),
                    _utc(resume),
                )
            else:
                latest = due_at.get(index)
                if latest is not None:
                    # Two windows of one task due in one tick (a stall): run the newer only,
                    # or the older's in-flight key would make the newer one skip.
                    superseded.append(
                        Skipped(task.id, ALL_TENANTS, _utc(latest), CronSkipReason.SUPERSEDED)
                    )
                    # Not fired either: part of the task's gap (if any beat ran the task
                    # before; a first start's catch-up window is no loss).
                    self._missed.append((task, latest, latest + length_s, True))
                due_at[index] = ts
            # Tasks sharing a spec and zone share the answer: one next() per spec per tick.
            memo = (type(task.schedule), task.spec, task.timezone, _anchor_of(task), resume)
            next_ts = next_fires.get(memo, _UNSET)
            if next_ts is _UNSET:
                when = task.next_fire(_utc(resume))
                next_ts = next_fires[memo] = None if when is None else when.timestamp()
            if next_ts is not None:
                heapq.heappush(heap, (cast(float, next_ts), index))  # neither _UNSET nor None
        due: dict[float, list[CronTask]] = {}
        for index, ts in due_at.items():
            due.setdefault(ts, []).append(self.tasks[index])
        if self._missed:
            # Before firing: the gap script skips windows whose task already handled a later
            # one, and this tick's claims are about to move last_window past the missed ones.
            self._record_missed(at)
        self._unseen.clear()  # only a first tick's catch-up can be "no loss"
        try:
            fired, skipped = self._fire(due, at, custom)
        except BaseException:
            self._heap = saved
            if custom:  # not claimed: ask them again at the next tick
                for req in custom:
                    self._custom_at[req.task.id] = -math.inf
                self._custom_next = -math.inf
            raise
        return TickReport(at, tuple(fired), tuple(missed + superseded + skipped))

    def take_over(self, at: datetime | None = None) -> Takeover:
        """Publish claims other callers took and never confirmed (see ``take_over_expired``)."""
        at = require_aware(at, "at") if at is not None else self.clock()
        by_id: dict[str, CronTask] | None = None

        def task_of(task_id: str) -> CronTask | None:
            nonlocal by_id
            if by_id is None:  # only built when a claim is taken over (rare)
                by_id = {task.id: task for task in self.tasks}
            return by_id.get(task_id)

        return take_over_expired(self.store, self.sender, task_of, now=at, owner=self.owner)

    def _record_missed(self, at: datetime) -> None:
        """Windows this engine slept through beyond their grace, and older windows due in the
        same tick as a newer one: one gap per task, unless someone fired them."""
        merged: dict[str, tuple[CronTask, float, float, bool]] = {}
        for task, first, end, superseded in self._missed:
            if superseded and task.id in self._unseen:
                continue  # a first start's catch-up window: no loss (cron_gaps.lua agrees)
            seen = merged.get(task.id)
            if seen is not None:  # nothing of a task between two of its ranges was fired
                first, end = min(first, seen[1]), max(end, seen[2])
                superseded = superseded and seen[3]
            merged[task.id] = (task, first, end, superseded)
        self._missed = []
        if not merged:
            return
        gaps = self._gaps(merged.values())
        try:
            note, self._step_note = self._step_note, ""
            self.store.record_gaps(gaps, at, f"{note}past their grace; found by {self.owner}")
        except Exception:
            log.exception("cron: could not record %d missed windows", len(gaps))

    def _gaps(self, ranges: Iterable[tuple[CronTask, float, float, bool]]) -> list[Gap]:
        """One :class:`Gap` per task for the windows it has in ``[first, end)``.

        A per-tenant task's gap names the provider's tenants (``*`` with a note when it cannot
        be read); without a provider it never fires, and diagnose says that instead."""
        gaps: list[Gap] = []
        counted: dict[
            tuple[str, str, str, datetime | None, float, float], tuple[float, int, float]
        ] = {}
        tenants: tuple[str, ...] | None = None
        note = ""
        for task, first, end, if_seen in ranges:
            if task.per_tenant and self.tenants is None:
                continue
            memo = (
                type(task.schedule).__name__,
                task.spec,
                task.timezone,
                _anchor_of(task),
                first,
                end,
            )
            if memo not in counted:
                counted[memo] = _count_windows(task, first, end)
            last, count, period = counted[memo]
            scope: tuple[str, ...] = ()
            if task.per_tenant:
                if tenants is None:
                    try:
                        # skipped above when there is no provider
                        tenants = tuple(read_tenants(cast(TenantsSource, self.tenants)))
                    except Exception as exc:
                        tenants, note = (ALL_TENANTS,), f"tenants unknown: provider failed: {exc}"
                scope = tenants
            stop = last + task.window_length.total_seconds() if count else end
            gaps.append(
                Gap(
                    task,
                    _utc(first),
                    _utc(stop),
                    count,
                    period,
                    scope,
                    note if scope else "",
                    if_seen=if_seen,
                )
            )
        return gaps

    def _announce(self, at: datetime) -> None:
        """First tick: read (or set, for a task no beat has seen) every task's reference
        instant and place the tasks after it, note the tasks as seen, and record windows nobody
        fired while no beat was running (the last handled window's successor is older than
        where we start)."""
        self._refs.update(self.store.note_refs(self.tasks, self._start))
        self.tasks = tuple(self._anchored(task) for task in self.tasks)
        self._place(self._start)
        stats = self.store.stats([task.id for task in self.tasks])
        ranges: list[tuple[CronTask, float, float, bool]] = []
        for task, begin in zip(self.tasks, self._starts, strict=True):
            last = stats.get(task.id, {}).get(CronStatsField.LAST_WINDOW)
            if not last:
                self._unseen.add(task.id)
                continue
            expected = task.next_fire(_utc(float(last)) + task.window_length)
            if expected is not None and expected < begin:
                ranges.append((task, expected.timestamp(), begin.timestamp(), False))
        gaps = self._gaps(ranges)
        self.store.note_first_seen(self.tasks, self._first_window)
        if gaps:
            recorded = self.store.record_gaps(gaps, at, f"no beat ran them; found by {self.owner}")
            log.warning("cron: %d tasks have windows nobody fired before this beat", recorded)
        self._announced = True

    def _custom_requests(self, at: datetime) -> list[FireRequest]:
        """The custom schedules due at ``at``: each asked ``is_due`` with the last run all
        beats share (one round trip reads them); sets when to ask again."""
        custom = self._custom
        if not custom:
            self._custom_next = math.inf
            return []
        now_ts = at.timestamp()
        # Each is asked when its own last answer said, as beat re-heaps an entry at its next
        # time: asking one sooner could find it due sooner than beat would.
        tasks = [task for task in custom if self._custom_at.get(task.id, -math.inf) <= now_ts]
        if not tasks:
            self._custom_next = min(self._custom_at.get(task.id, -math.inf) for task in custom)
            return []
        refs = self.store.read_refs(tasks)
        missing = [task for task in tasks if task.id not in refs]
        if missing:  # a reference deleted by hand: the task starts as a new one
            refs.update(self.store.note_refs(missing, at))
        window = at.astimezone(UTC).replace(microsecond=0)
        requests: list[FireRequest] = []
        for task in tasks:
            raw = refs[task.id]
            self._refs[task.id] = raw
            last = _utc(float(raw))
            wait = self.custom_max_wait
            try:
                due, next_s = task.is_due(last.astimezone(_zone_of(task.schedule)))
                wait = wait if next_s is None else min(wait, next_s)
            except Exception:
                log.exception("cron: %s: its schedule's is_due raised; asked again later", task.id)
                due = False
            self._custom_at[task.id] = now_ts + max(CUSTOM_MIN_WAIT, wait)
            if due:
                wid = interval_window_id(last)
                requests.append(FireRequest(task, GLOBAL_TENANT, window, wid=wid, ref=raw))
        self._custom_next = min(self._custom_at.get(task.id, -math.inf) for task in custom)
        return requests

    def _fire(
        self, due: dict[float, list[CronTask]], at: datetime, custom: Iterable[FireRequest] = ()
    ) -> tuple[list[Fired], list[Skipped]]:
        skipped: list[Skipped] = []
        requests: list[FireRequest] = list(custom)
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


def settle_long_lived() -> None:
    """Collect what is garbage now, then move every object still alive (the app, its tasks,
    the engine's schedules) out of the cyclic collector's sight (``gc.freeze``).

    Why: they live as long as the beat, and every full collection scans each of them and frees
    none; the objects of a due window's tick, many thousands, are what sets one off. A frozen
    object dropped later (a reload replaces tasks) is still freed by reference counting; only
    a cycle among frozen objects would stay. The beat calls this once its tasks are loaded.
    """
    gc.collect()
    gc.freeze()


def _count_windows(task: CronTask, first: float, end: float) -> tuple[float, int, float]:
    """(last window, how many, period) of ``task``'s windows in ``[first, end)``; ``first`` is
    one. Period is 0 when they are unevenly spaced; count is 0 past ``MAX_COUNTED``."""
    last, count, period = first, 1, 0.0
    length = task.window_length.total_seconds()
    while count <= MAX_COUNTED:
        when = task.next_fire(_utc(last + length))
        if when is None or when.timestamp() >= end:
            return last, count, max(period, 0.0)
        step = when.timestamp() - last
        period = step if count == 1 or period == step else -1.0
        last, count = when.timestamp(), count + 1
    return last, 0, 0.0


def _window_of(task: CronTask, at: datetime) -> datetime:
    return task.window_of(at)


def _anchor_of(task: CronTask) -> datetime | None:
    """An interval's anchor: tasks with one spec but different anchors fire apart."""
    return task.anchor


def _zone_of(schedule: Any) -> tzinfo:
    """The zone a custom schedule reads ``last_run_at`` in: its app's, as beat's entries hold
    ``app.now()`` (a crontab subclass reads the weekday and hour off it)."""
    try:
        return getattr(schedule.value, "tz", None) or UTC
    except Exception:
        return UTC


def _same_definition(old: CronTask, new: CronTask) -> bool:
    """Whether a reload may keep ``old``'s place: same fields (the dataclass equality) and the
    same schedule (its spec and kind)."""
    return old == new and type(old.schedule) is type(new.schedule)


__all__ = [
    "ALL_TENANTS",
    "WINDOW",
    "CronEngine",
    "Fired",
    "Sender",
    "Skipped",
    "TickReport",
    "settle_long_lived",
]
