"""Exact instant arithmetic on aware datetimes.

Python adds a timedelta to an aware datetime, and subtracts two datetimes sharing one tzinfo,
on the *wall clock*; across a DST change that is off by the change. Scheduling needs absolute
time (a period is elapsed seconds), so every sum and difference here goes through UTC and
results are returned in the caller's zone.

Sums saturate at :data:`EARLIEST` and :data:`LATEST` instead of raising OverflowError: a huge
tier credit or period must sort a job first or last, not stop the dispatcher for everyone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_ONE_MS = timedelta(milliseconds=1)
_ZERO = timedelta(0)

#: The bounds sums saturate at: a day inside datetime's range, so a saturated instant still
#: converts to any timezone (offsets are under 24 h) and to a Unix timestamp.
EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


def add(t: datetime, d: timedelta) -> datetime:
    """``t + d`` as elapsed time, expressed in ``t``'s timezone, saturated to
    [EARLIEST, LATEST] (never an OverflowError).

    A zero ``d`` returns ``t`` itself: routing a nonexistent wall time (inside a DST gap)
    through UTC would rewrite it, and "no offset" must mean "the very same value".
    """
    if not d:
        return t
    try:
        total = t.astimezone(UTC) + d
    except OverflowError:
        total = LATEST if d > _ZERO else EARLIEST
    return min(max(total, EARLIEST), LATEST).astimezone(t.tzinfo)


def elapsed_ms(later: datetime, earlier: datetime) -> float:
    """``later - earlier`` in milliseconds of elapsed time (negative when reversed)."""
    return (later.astimezone(UTC) - earlier.astimezone(UTC)) / _ONE_MS


def unix_second(t: datetime) -> int:
    """The Unix second containing ``t`` (floor, also before 1970), computed with integers."""
    return (t.astimezone(UTC) - _EPOCH) // _ONE_SECOND
