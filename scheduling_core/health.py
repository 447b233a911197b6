"""Check state as pure decisions: a region's state from its run results, the check's from a
region quorum, and whether an instant lies in a maintenance window.

Why pure: the post-exec write applies these atomically in Lua (``complete.lua``), the reaper
and the worker compute the region step before that write, and the tests prove the rules here,
with hypothesis, instead of through Redis. ``complete.lua``'s quorum count mirrors
:func:`overall_state` (tests/test_health_state.py checks them against each other).

States are ordered ``up < degraded < down``. A region moves to a *worse* state after
``failure_threshold`` consecutive results of that state, to a *better* one after
``success_threshold`` consecutive results of it; a result of the state the region is already
in keeps it there. A new region (no results yet) is ``up``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum

from scheduling_core.cron import Schedule

#: Bounds of the per-check thresholds (inclusive): one result up to a hundred in a row.
MIN_THRESHOLD = 1
MAX_THRESHOLD = 100
#: Bounds of a maintenance window's duration.
MIN_WINDOW = timedelta(minutes=1)
MAX_WINDOW = timedelta(days=7)
#: At most this many window starts are walked to find the one an instant falls in.
MAX_WINDOW_STEPS = 20_000


class State(StrEnum):
    """A region's or a check's state (stored as these strings)."""

    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"


_RANK = {State.UP: 0, State.DEGRADED: 1, State.DOWN: 2}


def classify(ok: bool, degraded: str | None = None) -> State:
    """The state one run result points to: a failure is down, a success with a degraded
    reason (a latency or certificate threshold crossed) degraded, any other success up."""
    if not ok:
        return State.DOWN
    return State.DEGRADED if degraded else State.UP


@dataclass(frozen=True)
class RegionHealth:
    """A region's state and the run of identical results that may move it (``streak``
    consecutive results pointing to ``streak_state``)."""

    state: State = State.UP
    streak_state: State = State.UP
    streak: int = 0


def region_step(
    health: RegionHealth, result: State, failure_threshold: int, success_threshold: int
) -> RegionHealth:
    """``health`` after one more result pointing to ``result``."""
    streak = health.streak + 1 if result == health.streak_state else 1
    state = health.state
    if result != state:
        needed = failure_threshold if _RANK[result] > _RANK[state] else success_threshold
        if streak >= needed:
            state = result
    # The streak is capped: it only ever needs to reach MAX_THRESHOLD.
    return RegionHealth(state, result, min(streak, MAX_THRESHOLD))


def default_quorum(regions: int) -> int:
    """A majority of the check's regions."""
    return regions // 2 + 1


def effective_quorum(quorum: int | None, regions: int) -> int:
    """The quorum a check uses: its own (at most its region count), else a majority."""
    if quorum is None:
        return default_quorum(regions)
    return max(1, min(quorum, regions))


def overall_state(states: list[State], quorum: int) -> State:
    """The check's state: down when at least ``quorum`` regions are down, degraded when at least
    ``quorum`` are degraded or down, else up."""
    down = sum(1 for s in states if s == State.DOWN)
    if down >= quorum:
        return State.DOWN
    if down + sum(1 for s in states if s == State.DEGRADED) >= quorum:
        return State.DEGRADED
    return State.UP


# --- maintenance windows ------------------------------------------------------------------


def window_end(
    schedule: Schedule, duration: timedelta, tz: tzinfo, now: datetime
) -> datetime | None:
    """When the maintenance window ``now`` falls in ends (windows start at each firing of
    ``schedule`` in ``tz`` and last ``duration``; overlapping windows merge), or None when
    ``now`` is in none. Starts are walked from ``now - duration``, at most MAX_WINDOW_STEPS."""
    # Real (UTC) arithmetic: a window lasts ``duration`` even across a DST change.
    utc_now = now.astimezone(UTC)
    start = schedule.next((utc_now - duration + timedelta(microseconds=1)).astimezone(tz))
    end: datetime | None = None
    steps = 0
    while start is not None and start.astimezone(UTC) <= utc_now and steps < MAX_WINDOW_STEPS:
        end = start.astimezone(UTC) + duration
        start = schedule.next_after(start)
        steps += 1
    if end is None or end <= utc_now:
        return None
    return end.astimezone(now.tzinfo)


def next_window_start(schedule: Schedule, tz: tzinfo, now: datetime) -> datetime | None:
    """The next start of a window strictly after ``now`` (None: the spec never fires)."""
    found = schedule.next_after(now.astimezone(tz))
    return None if found is None else found.astimezone(now.tzinfo)
