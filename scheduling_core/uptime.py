"""Uptime accounting as pure functions: a check's recorded transitions, its maintenance windows
and the span its state is known over, turned into time per category and incidents, for a range
and for each day, week or month of it (docs/reports.md is the method in words).

Why pure: the report is a claim about time, and the property test
(tests/test_uptime_core.py) checks these functions against a minute-by-minute replay of
generated results, which needs them apart from Redis. ``celery_app/checks/uptime.py`` reads the
inputs and calls these.

Every instant of a range falls in exactly one category, first match wins:

1. ``no_data``: outside the span the state is known over (before the history starts, after
   now, a region absent from a transition's regions);
2. ``maintenance``: inside a maintenance window of the check or its tenant;
3. the state then: ``up``, ``degraded`` or ``down``.

An incident is a maximal period of known ``down`` state (maintenance inside it does not split
it); its duration is its down time outside maintenance within the range, and it counts in a
range only when that duration is positive.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum

from scheduling_core.cron import Schedule
from scheduling_core.health import State

#: The longest range one report covers (a maintenance window every minute over it is walked).
MAX_RANGE = timedelta(days=366)


class Bucket(StrEnum):
    """How a report's range is cut: calendar days, ISO weeks (from Monday) or months."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"


@dataclass(frozen=True)
class Step:
    """One recorded transition of a check's overall state, with each region's state then."""

    at: float  # Unix s
    from_state: State
    to_state: State
    regions: Mapping[str, State] = field(default_factory=dict)


@dataclass(frozen=True)
class History:
    """What is stored about a check's state.

    ``steps`` oldest first; ``known_from``: the first instant the state is known (the check's
    first result, or the oldest retained transition when older ones were trimmed; None: nothing
    is known); ``known_until``: now; ``complete``: ``steps`` start at the check's first
    transition, so before it the check was in its initial state (``up``)."""

    steps: tuple[Step, ...]
    known_from: float | None
    known_until: float
    complete: bool


#: A span [start, end) in which the state is ``state``.
Segment = tuple[float, float, State]


def segments(history: History, region: str | None = None) -> list[Segment]:
    """The known states over [known_from, known_until), oldest first: the check's overall
    state, or with ``region`` the region's state as each transition recorded it (held until
    the next transition: regions are recorded only when the check's state moves)."""
    start, end = history.known_from, history.known_until
    if start is None or start >= end:
        return []
    points: list[tuple[float, State | None]] = []
    steps = history.steps
    if region is None:
        first = steps[0].from_state if steps else State.UP
        points.append((float("-inf"), first))
        points += [(s.at, s.to_state) for s in steps]
    else:
        points.append((float("-inf"), State.UP if history.complete else None))
        points += [(s.at, s.regions.get(region)) for s in steps]
    out: list[Segment] = []
    for i, (at, state) in enumerate(points):
        seg_start = max(at, start)
        seg_end = min(points[i + 1][0], end) if i + 1 < len(points) else end
        if state is not None and seg_start < seg_end:
            out.append((seg_start, seg_end, state))
    return out


def merge_spans(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint spans covering the same instants (touching spans join)."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(sp for sp in spans if sp[0] < sp[1]):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def window_spans(
    schedule: Schedule, duration: timedelta, tz: tzinfo, start: float, end: float
) -> list[tuple[float, float]]:
    """The spans of one maintenance window definition that meet [start, end), clipped to it:
    a window starts at each firing of ``schedule`` in ``tz`` and lasts ``duration`` of real
    time (as ``health.window_end`` decides it for a run)."""
    span = duration.total_seconds()
    first = datetime.fromtimestamp(start - span, UTC) + timedelta(microseconds=1)
    fire = schedule.next(first.astimezone(tz))
    out: list[tuple[float, float]] = []
    while fire is not None:
        s = fire.timestamp()
        if s >= end:
            break
        out.append((max(s, start), min(s + span, end)))
        fire = schedule.next_after(fire)
    return merge_spans(out)


def _overlap(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end) inside the sorted, disjoint ``spans``."""
    total = 0.0
    i = max(0, bisect.bisect_right(spans, (start, float("inf"))) - 1)
    while i < len(spans) and spans[i][0] < end:
        s, e = spans[i]
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            total += hi - lo
        i += 1
    return total


@dataclass(frozen=True)
class Totals:
    """One range's accounting; seconds, and the incidents in it."""

    start: float
    end: float
    up: float
    degraded: float
    down: float
    maintenance: float
    no_data: float
    incidents: int
    longest_incident: float  # 0 when none
    recovered: int  # incidents that ended in the range by a recovery
    recovery_total: float  # their durations summed

    @property
    def measured(self) -> float:
        return self.up + self.degraded + self.down

    @property
    def uptime_pct(self) -> float | None:
        """Available time (up or degraded) per measured time, in percent; None: nothing
        measured."""
        measured = self.measured
        return None if measured <= 0 else 100.0 * (self.up + self.degraded) / measured

    @property
    def healthy_pct(self) -> float | None:
        """``up`` alone per measured time, in percent; None: nothing measured."""
        measured = self.measured
        return None if measured <= 0 else 100.0 * self.up / measured

    @property
    def mttr(self) -> float | None:
        """Mean duration of the incidents that recovered in the range; None: none did."""
        return self.recovery_total / self.recovered if self.recovered else None


def account(
    segs: Sequence[Segment],
    maintenance: Sequence[tuple[float, float]],
    start: float,
    end: float,
) -> Totals:
    """The accounting of [start, end) (see the module docstring) from the known ``segs`` and
    the merged ``maintenance`` spans."""
    time = {State.UP: 0.0, State.DEGRADED: 0.0, State.DOWN: 0.0}
    known = 0.0
    # only the segments that meet the range (sorted and disjoint: their ends are sorted too)
    first = bisect.bisect_right(segs, start, key=lambda seg: seg[1])
    last = bisect.bisect_left(segs, end, lo=first, key=lambda seg: seg[0])
    for s, e, state in segs[first:last]:
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            known += hi - lo
            time[state] += (hi - lo) - _overlap(maintenance, lo, hi)
    in_window = known - sum(time.values())
    incidents, longest, recovered, recovery_total = 0, 0.0, 0, 0.0
    i = first
    while i < last:
        if segs[i][2] != State.DOWN:
            i += 1
            continue
        j = i
        while j + 1 < len(segs) and segs[j + 1][2] == State.DOWN and segs[j + 1][0] == segs[j][1]:
            j += 1
        d_start, d_end = segs[i][0], segs[j][1]
        lo, hi = max(d_start, start), min(d_end, end)
        counted = (hi - lo) - _overlap(maintenance, lo, hi) if lo < hi else 0.0
        if counted > 0:
            incidents += 1
            longest = max(longest, counted)
            # recovered in the range: the next known state starts where the down one ends
            if j + 1 < len(segs) and segs[j + 1][0] == d_end and start < d_end <= end:
                recovered += 1
                recovery_total += counted
        i = j + 1
    return Totals(
        start=start,
        end=end,
        up=time[State.UP],
        degraded=time[State.DEGRADED],
        down=time[State.DOWN],
        maintenance=in_window,
        no_data=(end - start) - known,
        incidents=incidents,
        longest_incident=longest,
        recovered=recovered,
        recovery_total=recovery_total,
    )


def bucket_start(moment: datetime, by: Bucket) -> datetime:
    """The local start of the day, ISO week or month ``moment`` (aware, in the report's
    timezone) falls in; the first instant of that local date, also across a DST change."""
    day = moment.date()
    if by == Bucket.WEEK:
        day -= timedelta(days=day.weekday())
    elif by == Bucket.MONTH:
        day = day.replace(day=1)
    local = datetime(day.year, day.month, day.day, tzinfo=moment.tzinfo)
    return local.astimezone(UTC).astimezone(moment.tzinfo)


def _next_local(day_start: datetime, by: Bucket) -> datetime:
    day = day_start.date()
    if by == Bucket.DAY:
        day += timedelta(days=1)
    elif by == Bucket.WEEK:
        day += timedelta(days=7)
    else:
        day = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
    local = datetime(day.year, day.month, day.day, tzinfo=day_start.tzinfo)
    return local.astimezone(UTC).astimezone(day_start.tzinfo)


def bucket_spans(start: float, end: float, by: Bucket, tz: tzinfo) -> list[tuple[float, float]]:
    """[start, end) cut at the starts of local days, weeks or months in ``tz``; the first and
    last bucket are clipped to the range."""
    spans: list[tuple[float, float]] = []
    cursor = bucket_start(datetime.fromtimestamp(start, tz), by)
    while cursor.timestamp() < end:
        following = _next_local(cursor, by)
        spans.append((max(cursor.timestamp(), start), min(following.timestamp(), end)))
        cursor = following
    return spans
