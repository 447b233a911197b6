"""Celery's ``crontab`` as a set of instants, exact to the firings of Celery's own beat.

:class:`CeleryCrontab` takes the five value sets a ``celery.schedules.crontab`` has already
expanded (``minute``, ``hour``, ``day_of_week``, ``day_of_month``, ``month_of_year``) and answers
like :class:`scheduling_core.cron.Schedule`: ``next(t)`` is the earliest minute start ``>= t``
that fires, ``next_after(t)`` the first firing strictly after ``t``, ``matches(t)`` whether the
minute of ``t`` fires, all read in ``t``'s own timezone, which must be the crontab's (the Celery
app's ``timezone``). No Celery import: the translation from a ``crontab`` object is
:mod:`celery_app.cron_tasks.celery_schedules`; ``tests/test_celery_crontab_differential.py``
checks this module against Celery's ``remaining_estimate``/``is_due`` (Celery 5.7).

What Celery's beat does, and so what this does
----------------------------------------------
Beat keeps a ``last_run_at`` per entry (the instant it last sent the task) and sends again once
``crontab.remaining_estimate(last_run_at)`` reaches zero. That estimate (``remaining_delta`` and
``celery.utils.time.ffwd``/``remaining``) reads ``last_run_at`` on the wall clock of the app's
timezone, takes the first wall-clock minute *strictly after* ``last_run_at``'s minute whose
month, day of month, day of week, hour and minute are all in their sets, and turns that naive
wall time into an instant with ``fold=0`` (``ffwd`` ends with a ``timedelta`` addition, which
resets ``fold``). The firings of a beat that runs continuously are therefore the chain
``f' = first matching wall minute after wall(f), read with fold=0``, and that chain is the set
of instants this module implements. In words:

* Every day field is ANDed: a day fires when its month is in ``month_of_year`` *and* its day in
  ``day_of_month`` *and* its weekday in ``day_of_week`` (0-6, Sunday = 0). Vixie cron and cronie
  OR the two day fields when both are restricted (``crontab(0, 0, day_of_week=5,
  day_of_month=13)`` is Friday the 13th in Celery; every 13th and every Friday in cron).
* Spring forward (a gap of skipped wall-clock minutes, length ``g``): a wall time in the gap is
  read with the offset from before the gap, so it fires ``g`` later on the new wall clock:
  ``crontab(30, 2)`` fires at 03:30 CEST on the Berlin spring-forward day (cronie: 03:00). This
  holds for every crontab (``crontab(minute=30)`` too: its 02:30 becomes 03:30, which it fires
  anyway) and for a gap of any size (cronie: shorter than three hours). Only the *first*
  matching wall time of the gap fires; beat then continues strictly after the wall time it fired
  at, so the other matching times of the gap and the real matching times between the end of the
  gap and that shifted firing never fire. With a half-hour gap (Australia/Lord_Howe, 02:00 ->
  02:30) ``crontab(minute="10,35", hour=2)`` fires at 02:40 only: 02:35 is real and matches, and
  is dropped. With one-hour gaps on the hour this never drops a real time (the shifted time has
  the smallest minute of the set), but Pacific/Chatham's 02:45 -> 03:45 gap can.
* Fall back (an overlap of repeated wall-clock minutes): every matching wall time fires once, in
  the first pass (``fold=0``); nothing fires in the repeated pass, for any crontab. cronie fires
  wildcard jobs (``*/15 * * * *``) in both passes; Celery's ``crontab(minute="*/15")`` fires
  01:00-01:45 EDT in New York on the fall-back day and then 02:00 EST.
* Otherwise it follows the wall clock, every minute matching all five sets.

Celery's syntax differs from Vixie's too, though that is Celery's parser, not this module (it
receives the expanded sets): ranges wrap (``"22-2"`` is 22, 23, 0, 1, 2; ``"fri-mon"``), names
are any word whose first three letters name a day or month, ``N/S`` (cronie: ``N-max/S``) is
refused, day of week 7 is refused, and ``day_of_month`` values that exist in none of the
``month_of_year`` months (the 30th of February) are refused at construction (as here).

Celery behaviour not replicated, on purpose
-------------------------------------------
Celery's answers depend on ``last_run_at``, which a set of instants has not; these are the
places where that history makes Celery differ from its own continuous chain. The differential
test pins the first two.

1. From a ``last_run_at`` in the repeated pass of an overlap, Celery answers with the first pass:
   an instant *before* ``last_run_at``. A beat (re)started in the repeated hour therefore finds
   the entry due at once, sends it, and finds it due again on every tick (``last_run_at`` stays
   in the repeated pass) until the pass ends: a burst of sends. A bug; here nothing fires in the
   repeated pass.
2. From a ``last_run_at`` between the end of a gap and the gap's shifted firing (a beat started
   there), Celery fires the real matching times that its continuous chain drops. Here they are
   dropped whenever the gap has a matching time, so every beat agrees.
3. A beat that wakes more than a minute late continues from the minute it woke in, skipping what
   matched in between; a late wake-up, and catching up on it, is the engine's business.

Assumptions: the timezone follows PEP 495 (``zoneinfo`` or ``datetime.timezone``), its offsets
and transitions are whole minutes, and it does not change offset twice within 26 hours (gaps up
to a day long, such as Samoa's skipped 2011-12-30, are handled).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, NoReturn

from scheduling_core._time import require_aware
from scheduling_core.cron import CronError, Schedule, from_value_sets
from scheduling_core.errors import CheckbeatError

__all__ = ["CeleryCrontab", "CeleryCrontabError"]

_MINUTE = timedelta(minutes=1)
#: How far back a gap can still shadow ``t``: a gap of length g drops matches up to g after it,
#: and no clock change in the tz database skipped more than a day.
_LOOKBACK = timedelta(hours=26)
# name, lowest, highest, in the order Celery's crontab() takes them
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_week", 0, 6),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
)
#: minute hour day-of-month month day-of-week, the order of a cron line (and of Celery's repr)
_CRON_ORDER = (0, 1, 3, 4, 2)
# Celery's CRON_DAYS_IN_MONTH: the longest February, so the 29th of February is allowed
_LONGEST_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CeleryCrontabError(CheckbeatError, ValueError):
    """Field sets Celery's ``crontab`` would refuse; ``field`` names the field (or is None)."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def _field_values(name: str, lo: int, hi: int, values: Iterable[int]) -> frozenset[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise CeleryCrontabError(
            f"{name}: expected a set of whole numbers {lo}-{hi}, got {values!r}", field=name
        )
    found = frozenset(values)
    bad = sorted((v for v in found if type(v) is not int or not lo <= v <= hi), key=repr)
    if bad:
        raise CeleryCrontabError(
            f"{name}: {bad[0]!r} is not a whole number in {lo}-{hi}", field=name
        )
    if not found:
        raise CeleryCrontabError(f"{name}: no values; allowed: {lo}-{hi}", field=name)
    return found


def _compress(values: frozenset[int], lo: int, hi: int) -> str:
    """``{1, 2, 3, 5}`` -> ``"1-3,5"``; the full range is ``"*"``."""
    if values == frozenset(range(lo, hi + 1)):
        return "*"
    parts: list[str] = []
    ordered = sorted(values)
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(parts)


def _first_with_offset(lo: datetime, hi: datetime, tz: tzinfo, offset: timedelta) -> datetime:
    """The first whole-minute UTC instant in ``(lo, hi]`` whose offset in ``tz`` is ``offset``,
    given that ``lo``'s is not and ``hi``'s is (one transition in between)."""
    while hi - lo > _MINUTE:
        mid = lo + (hi - lo) // _MINUTE // 2 * _MINUTE
        if mid.astimezone(tz).utcoffset() == offset:
            hi = mid
        else:
            lo = mid
    return hi


def _minute_start_utc(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(second=0, microsecond=0)


class CeleryCrontab:
    """A Celery ``crontab`` (its expanded value sets) as the set of instants its beat fires.

    Immutable and hashable; equal when the five sets are equal (as Celery's ``crontab.__eq__``).
    ``spec`` is the text ``describe`` shows, in cron order (minute hour day-of-month month
    day-of-week), by default built from the sets.
    """

    __slots__ = (
        "_key",
        "_wall",
        "day_of_month",
        "day_of_week",
        "hour",
        "minute",
        "month_of_year",
        "spec",
    )

    minute: frozenset[int]
    hour: frozenset[int]
    day_of_week: frozenset[int]
    day_of_month: frozenset[int]
    month_of_year: frozenset[int]
    spec: str
    _wall: Schedule
    _key: tuple[frozenset[int], ...]

    def __init__(
        self,
        minute: Iterable[int],
        hour: Iterable[int],
        day_of_week: Iterable[int],
        day_of_month: Iterable[int],
        month_of_year: Iterable[int],
        *,
        spec: str | None = None,
    ) -> None:
        sets = [
            _field_values(name, lo, hi, values)
            for (name, lo, hi), values in zip(
                _FIELDS, (minute, hour, day_of_week, day_of_month, month_of_year), strict=True
            )
        ]
        minutes, hours, dows, doms, months = sets
        if not any(day <= _LONGEST_MONTH[month] for month in months for day in doms):
            raise CeleryCrontabError(
                f"day_of_month {_compress(doms, 1, 31)} never occurs in month_of_year "
                f"{_compress(months, 1, 12)}",
                field="day_of_month",
            )
        if spec is None:
            spec = " ".join(_compress(sets[i], *_FIELDS[i][1:]) for i in _CRON_ORDER)
        try:
            wall = from_value_sets(
                spec,
                minutes=minutes,
                hours=hours,
                days_of_month=doms,
                months=months,
                days_of_week=dows,
                day_or=False,  # Celery ANDs the day fields
                fixed_time=True,  # unused: this module maps wall times by Celery's rule
            )
        except CronError as exc:  # unreachable after the checks above; keep the type promise
            raise CeleryCrontabError(str(exc), field=exc.field) from None
        values = {
            "minute": minutes,
            "hour": hours,
            "day_of_week": dows,
            "day_of_month": doms,
            "month_of_year": months,
            "spec": spec,
            "_wall": wall,
            "_key": (minutes, hours, dows, doms, months),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # -- value semantics ------------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"CeleryCrontab is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"CeleryCrontab is immutable (cannot delete {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CeleryCrontab):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"CeleryCrontab({self.spec!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (*(sorted(s) for s in self._key), self.spec))

    @property
    def never(self) -> bool:
        """Always False: every (month, day) pair Celery accepts falls on every weekday within
        the 400-year Gregorian cycle, so the AND rule always leaves days. (Interface parity.)"""
        return self._wall.never

    def describe(self, tz: tzinfo | str | None = None) -> str:
        """The schedule for ``schedule list``: ``"crontab 0 4 * * *"``, with the zone if given."""
        text = f"crontab {self.spec}"
        if tz is None:
            return text
        return f"{text} ({getattr(tz, 'key', None) or tz})"

    # -- firing ---------------------------------------------------------------------------------

    def next(self, t: datetime) -> datetime | None:
        """The earliest minute start ``>= t`` at which it fires, in ``t``'s timezone (seconds
        round up). ``None`` only past year 9999. Naive ``t`` raises ``ValueError``."""
        require_aware(t, "t")
        start = _minute_start_utc(t)
        if start != t.astimezone(UTC):  # in UTC: an ambiguous t never equals another zone's
            start += _MINUTE
        found = self._next_instant(start, t.tzinfo)  # type: ignore[arg-type]  # aware: require_aware
        return None if found is None else found.astimezone(t.tzinfo)

    def next_after(self, t: datetime) -> datetime | None:
        """The first firing strictly after ``t``'s minute, in ``t``'s timezone: the next instant
        Celery's beat fires after sending at ``t``. Walk the firings with this."""
        require_aware(t, "t")
        found = self._next_instant(_minute_start_utc(t) + _MINUTE, t.tzinfo)  # type: ignore[arg-type]  # aware
        return None if found is None else found.astimezone(t.tzinfo)

    def matches(self, t: datetime) -> bool:
        """Whether it fires in the minute of ``t`` (read in ``t``'s timezone)."""
        require_aware(t, "t")
        start = _minute_start_utc(t)
        return self._next_instant(start, t.tzinfo) == start  # type: ignore[arg-type]  # aware: require_aware

    def _next_instant(self, start: datetime, tz: tzinfo) -> datetime | None:
        """The first firing (UTC) at or after the whole-minute UTC instant ``start``."""
        local = start.astimezone(tz)
        offset = local.utcoffset()
        earlier = (start - _LOOKBACK).astimezone(tz).utcoffset()
        assert offset is not None and earlier is not None
        if earlier < offset:  # a gap in the last day: start may be in its firing's shadow
            shifted = self._gap_firing(start - _LOOKBACK, start, tz, earlier, offset)
            if shifted is not None and start <= shifted:
                return shifted
        wall = local.replace(tzinfo=None)
        if local.fold:  # the repeated pass: its wall times fired in the first pass
            first = local.replace(fold=0).utcoffset()
            assert first is not None
            transition = _first_with_offset(start - (first - offset), start, tz, offset)
            wall = (transition + first).replace(tzinfo=None)  # the first wall after the overlap
        found = self._wall.next_wall(wall)
        if found is None:
            return None
        # fold=0, as Celery reads it: a time in a gap takes the offset from before the gap
        return found.replace(tzinfo=tz).astimezone(UTC)

    def _gap_firing(
        self, lo: datetime, hi: datetime, tz: tzinfo, before: timedelta, after: timedelta
    ) -> datetime | None:
        """The instant (UTC) the gap between ``lo`` and ``hi`` fires at, if a wall time in it
        matches: its first matching wall time, read with the offset from before the gap."""
        transition = _first_with_offset(lo, hi, tz, after)
        gap_end = (transition + after).replace(tzinfo=None)
        found = self._wall.next_wall(gap_end - (after - before))
        if found is None or found >= gap_end:
            return None
        return (found - before).replace(tzinfo=UTC)


def _rebuild(
    minute: list[int],
    hour: list[int],
    day_of_week: list[int],
    day_of_month: list[int],
    month_of_year: list[int],
    spec: str,
) -> CeleryCrontab:
    return CeleryCrontab(minute, hour, day_of_week, day_of_month, month_of_year, spec=spec)
