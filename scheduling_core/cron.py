"""Five-field cron expressions, exact to cronie, defined across DST.

``parse(spec)`` returns an immutable :class:`Schedule`; ``Schedule.matches(t)`` says whether it
fires in the minute of ``t`` and ``Schedule.next(t)`` returns the earliest minute start ``>= t``
at which it fires, both read in ``t``'s own timezone; ``Schedule.next_after(t)`` is the first
firing strictly after ``t``. Bad specs raise :class:`CronError`, a ``ValueError`` whose message
names the field, the token and what is allowed (also as ``.field`` and ``.token``).
``Schedule.spec``, ``describe()``, ``never`` and ``fixed_time`` are for ``schedule list``.
``from_value_sets`` builds a schedule from sets another parser expanded (Celery's ``crontab``,
see :mod:`scheduling_core.celery_crontab`), and ``Schedule.next_wall`` searches wall-clock time
with no DST rule, for callers that map wall times to instants by their own.

Syntax (cronie, the cron of most Linux machines)
-------------------------------------------------
Five whitespace-separated fields: minute (0-59), hour (0-23), day-of-month (1-31), month (1-12 or
JAN-DEC) and day-of-week (0-7 or SUN-SAT; 0 and 7 are Sunday). Each field is a comma list of
``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S`` and ``N/S`` (which means ``N-max/S``). Names are
case-insensitive and allowed wherever a number is, but not as a step. A day-of-week range that
ends at 0 or SUN ends at 7, so ``FRI-SUN`` is Friday, Saturday, Sunday (``SUN-SUN`` and ``0-0``
stay just Sunday); any other range whose start is after its end is an error. The macros are
``@yearly`` = ``@annually`` (``0 0 1 1 *``), ``@monthly`` (``0 0 1 * *``), ``@weekly``
(``0 0 * * 0``), ``@daily`` = ``@midnight`` (``0 0 * * *``) and ``@hourly`` (``0 * * * *``).

Not supported, each with its own message: seconds (six or seven fields; work that has to happen
every few seconds is a worker, not a schedule), ``@reboot`` (not a time), Quartz's ``?``, ``L``,
``W`` and ``#``, a step of 0, empty fields and list elements.

The day rule
------------
A day field is *restricted* unless its text starts with ``*`` (so ``*/2`` is unrestricted, while
``1-31`` is restricted). When both day-of-month and day-of-week are restricted a day matches if
**either** matches; otherwise both must. ``0 0 13 * 5`` fires on every 13th and on every Friday;
``0 0 */2 * 1`` fires on odd-numbered days that are Mondays. A spec whose days can never exist
(``0 0 30 2 *``, ``0 0 31 4,6,9,11 *``) parses, and its ``next`` is ``None``.

Daylight saving time (cronie, ``man 8 cron``: "Daylight Saving Time and other time changes")
--------------------------------------------------------------------------------------------
A job is *fixed-time* unless its minute or its hour field starts with ``*``. Across a transition:

* Spring forward (a gap of skipped wall-clock minutes): a fixed-time job whose time falls in the
  gap fires once, at the first minute after the gap -- the first instant of the new offset, e.g.
  03:00 CEST for ``30 2 * * *`` on the spring-forward day in Europe/Berlin. Several skipped
  matches (``0,30 2 * * *``) and a match at the gap's end itself collapse into that one firing:
  a schedule is a set of instants. A wildcard job (``*/15 * * * *``, ``0 * * * *``) follows the
  wall clock and simply does not fire in the minutes that do not exist.
* Fall back (an overlap of repeated wall-clock minutes): a fixed-time job fires once, at the first
  occurrence (``fold=0``); in the repeated pass it does not fire, so ``next`` from 01:31 EDT for
  ``30 1 * * *`` on the New York fall-back day is 01:30 EST of the *next* day. A wildcard job fires
  in both passes (``fold=0`` and then ``fold=1``).

Like cronie, this applies to gaps shorter than three hours and overlaps of up to three hours; a
bigger jump (Samoa skipping 2011-12-30 to cross the date line) is not DST, and every job then
follows the wall clock.

``matches`` and ``next`` implement the same set of instants: ``matches(t)`` is true exactly when
``next`` of the start of ``t``'s minute returns that minute. Walking the firing instants is
``next_after(prev)`` (the first firing strictly after ``prev``), or ``next`` of one *real*
minute later. Beware that ``prev + timedelta(minutes=1)`` on a zoneinfo datetime is wall-clock
arithmetic and drops ``fold``: from 01:59 EDT it gives 02:00 EST, skipping the repeated hour, and
from 01:30 EST (fold=1) it gives 01:31 EDT, back in time. Fixed-time jobs are immune (they never
fire in the repeated pass); wildcard jobs are not, so use ``next_after`` or add in UTC.
Assumptions: UTC offsets are whole minutes and a zone does not change offset twice within a few
hours (true of every tzdata rule since 1900); local mean time before 1900 is not supported.

Equality
--------
Schedules compare (and hash) by their parsed meaning, not by text: the expanded value sets, the
day rule and the fixed-time flag. ``@weekly``, ``0 0 * * 0``, ``0 0 * * 7`` and
``0 0 * * sun`` are equal; so are ``0 0 * * *``, ``0 0 */1 * *`` and ``0 0 1-31 * 0-6`` (every
day either way). The fixed-time/wildcard distinction is part of the meaning (``0 0 * * *``
differs from ``*/60 0 * * *``: they behave differently across DST), and every spec that can
never fire equals every other. It is not a full equivalence decision: values that can never
matter still count (``0 0 29-31 2 *`` differs from ``0 0 29 2 *``). ``repr`` and ``spec`` keep
the original text; ``Schedule(spec)`` is ``parse(spec)``, and pickling re-parses the text.

Speed
-----
Each field is a bitmask; the days of a month are one mask per (weekday of the 1st, month length),
precomputed at parse. ``next`` jumps to the next matching month, day, hour and minute with bit
tricks and never walks minute by minute, so the answer is exact however far away it is
(``0 0 29 2 *`` from 2096-03-01 is 2104-02-29). ``datetime.timezone`` instances and the tz
database's fixed-offset zones (``UTC``, ``Etc/GMT+5``...) take a fast path; any other tzinfo
takes the DST-aware path, which needs PEP 495 semantics (``zoneinfo``; not ``pytz``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from typing import Any, NoReturn

from scheduling_core._time import require_aware
from scheduling_core.errors import CheckbeatError

__all__ = ["CronError", "Schedule", "from_value_sets", "parse"]

_UTC = UTC
# cron.c classifies the wall-clock jump it wakes up to: more than 180 minutes either way is a
# "large" jump, not DST. A gap of d minutes is a jump of d + 1, an overlap of d a jump of -(d - 1):
# gaps shorter than 3 hours and overlaps up to 3 hours get the DST treatment.
_DST_LIMIT = timedelta(hours=3)
_MINUTE = timedelta(minutes=1)
_MAX_YEAR = 9999

FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_MIN, _HOUR, _DOM, _MONTH, _DOW = range(5)
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTH_NAMES = {name: i + 1 for i, name in enumerate(_MONTHS)}
_DOW_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_NAMES: tuple[dict[str, int] | None, ...] = (None, None, None, _MONTH_NAMES, _DOW_NAMES)
_ALLOWED = (
    "0-59",
    "0-23",
    "1-31",
    "1-12 or JAN-DEC",
    "0-7 or SUN-SAT (0 and 7 are Sunday)",
)
_SYNTAX = "*, N, A-B, */S, A-B/S, N/S and comma lists of these"

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_LIST = "minute hour day-of-month month day-of-week"
# tz database zones that never change offset: wall-clock arithmetic is exact in them, so they
# take the same fast path as datetime.timezone (zoneinfo has no API to ask a zone this).
_FIXED_ZONES = frozenset(
    [
        *(f"{prefix}{name}" for prefix in ("", "Etc/") for name in ("UTC", "UCT", "Universal")),
        *(f"{prefix}{name}" for prefix in ("", "Etc/") for name in ("Zulu", "Greenwich")),
        *(f"{prefix}GMT{suffix}" for prefix in ("", "Etc/") for suffix in ("", "0", "+0", "-0")),
        *(f"Etc/GMT+{hours}" for hours in range(1, 13)),
        *(f"Etc/GMT-{hours}" for hours in range(1, 15)),
    ]
)
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_LONG_MONTHS = sum(1 << m for m in range(1, 13) if _DAYS_IN_MONTH[m] == 31)
_SHORT_MONTHS = sum(1 << m for m in range(1, 13) if _DAYS_IN_MONTH[m] == 30)
_FEBRUARY = 1 << 2
# '*' per field; day-of-week keeps Sunday as 0 only
_FULL = tuple(
    (1 << (hi + 1)) - (1 << lo) for lo, hi in ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
)
_ALL_DAYS = (1 << 32) - 2  # bits 1..31
_MONTH_DAYS = {length: (1 << (length + 1)) - 2 for length in (28, 29, 30, 31)}
_FIVE_WEEKS = sum(1 << (7 * week) for week in range(5))  # multiplier that repeats 7 bits 5 times


class CronError(CheckbeatError, ValueError):
    """A spec that cronie would refuse (or that we refuse on purpose).

    ``field`` is the field's name (``"minute"`` ... ``"day-of-week"``) or ``None`` when the
    problem is the spec as a whole; ``token`` is the offending text.
    """

    def __init__(self, message: str, *, field: str | None = None, token: str | None = None):
        super().__init__(message)
        self.field = field
        self.token = token


def _fail(index: int, token: str, problem: str) -> NoReturn:
    field = FIELD_NAMES[index]
    raise CronError(
        f"{field} field: bad token {token!r}: {problem}; allowed: {_ALLOWED[index]} ({_SYNTAX})",
        field=field,
        token=token,
    )


def _value(text: str, index: int, item: str) -> int:
    """One number or name of field ``index``, range-checked."""
    lo, hi = _BOUNDS[index]
    if text.isascii() and text.isdigit():
        value = int(text)
    else:
        names = _NAMES[index]
        upper = text.upper()
        if names is not None and upper in names:
            return names[upper]
        if text == "":
            _fail(index, item, "a number is missing")
        if text == "*":
            _fail(index, item, "'*' cannot be part of a range; it stands alone or as '*/S'")
        if upper in ("L", "LW") or (upper[:-1].isdigit() and upper[-1:] in ("L", "W")):
            _fail(index, item, f"{text!r} is Quartz syntax (L, W), which cron does not have")
        if text.startswith(("+", "-")) or text.lstrip("+-").isdigit():
            _fail(index, item, f"{text!r} is signed; values are plain numbers")
        what = "a number or a name" if names is not None else "a number"
        _fail(index, item, f"{text!r} is not {what}")
    if not lo <= value <= hi:
        _fail(index, item, f"{value} is out of range")
    return value


def _parse_field(text: str, index: int) -> int:
    """The bitmask (bit n set = value n matches) of one field's text."""
    lo, hi = _BOUNDS[index]
    if text == "*":
        return _FULL[index]
    if text.isascii() and text.isdigit() and lo <= int(text) <= hi and index != _DOW:
        return 1 << int(text)
    mask = 0
    for item in text.split(","):
        if item == "":
            _fail(index, text, "empty list element")
        if "?" in item:
            _fail(index, item, "'?' is Quartz syntax, which cron does not have; use '*'")
        if "#" in item:
            _fail(index, item, "'#' (nth weekday) is Quartz syntax, which cron does not have")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()):
                _fail(index, item, f"step {step_text!r} is not a positive whole number")
            step = int(step_text)
            if step == 0:
                _fail(index, item, "step 0 is not allowed; a step is a positive whole number")
        if base == "*":
            start, end = lo, hi
        else:
            first, dash, second = base.partition("-")
            start = _value(first, index, item)
            if dash:
                end = _value(second, index, item)
                if index == _DOW and end == 0 and start > 0:
                    end = 7  # FRI-SUN: a day-of-week range ending at Sunday ends at 7
                if start > end:
                    _fail(index, item, f"range start {start} is after its end {end}")
            elif slash:
                end = hi  # N/S means N-max/S
            else:
                end = start
        if step == 1:
            mask |= (1 << (end + 1)) - (1 << start)
        else:
            for value in range(start, end + 1, step):
                mask |= 1 << value
    if index == _DOW and mask & 0x81:  # 0 and 7 are both Sunday; keep it as 0
        mask = (mask | 1) & 0x7F
    return mask


def _low(mask: int) -> int:
    """Index of the lowest set bit of a non-zero mask."""
    return (mask & -mask).bit_length() - 1


def _split(spec: str) -> tuple[str, list[str]]:
    if not isinstance(spec, str):
        raise TypeError(f"cron spec must be a str, got {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise CronError(
            f"empty cron spec; expected five fields ({_FIELD_LIST}) or a macro",
            token=spec,
        )
    if text.startswith("@"):
        word = text.lower()
        if word in MACROS:
            return text, MACROS[word].split()
        macros = " ".join(MACROS)
        if word == "@reboot":
            raise CronError(
                "@reboot is not supported: it means 'when the daemon starts', which is not a "
                f"time a scheduler can compute; allowed macros: {macros}",
                token=text,
            )
        raise CronError(f"unknown macro {text!r}; allowed macros: {macros}", token=text)
    fields = text.split()
    if len(fields) != 5 and re.search(r",\s|\s,", text):
        raise CronError(
            f"{text!r} has a space next to a comma; a list is one field with no spaces in it "
            "(write 1,15 not 1, 15)",
            token=text,
        )
    if len(fields) in (6, 7):
        raise CronError(
            f"{text!r} has {len(fields)} fields, but a cron spec has five ({_FIELD_LIST}): "
            "seconds (and years) are not supported, because work that has to happen every "
            "few seconds is a worker, not a schedule",
            token=text,
        )
    if len(fields) != 5:
        raise CronError(
            f"{text!r} has {len(fields)} field{'s' if len(fields) != 1 else ''}; "
            f"a cron spec has five ({_FIELD_LIST}) or is a macro ({' '.join(MACROS)})",
            token=text,
        )
    return text, fields


def parse(spec: str) -> Schedule:
    """Parse a five-field cron spec or a macro; raise :class:`CronError` if it is invalid."""
    _, fields = _split(spec)
    masks = [_parse_field(text, i) for i, text in enumerate(fields)]
    dom_star = fields[_DOM].startswith("*")
    dow_star = fields[_DOW].startswith("*")
    wildcard = fields[_MIN].startswith("*") or fields[_HOUR].startswith("*")
    return Schedule._build(spec, masks, day_or=not (dom_star or dow_star), wildcard=wildcard)


def _set_mask(values: Iterable[int], index: int) -> int:
    """The bitmask of an already-expanded set of values of field ``index``, range-checked."""
    lo, hi = _BOUNDS[index]
    if index == _DOW:
        hi = 6
    mask = 0
    for value in values:
        if type(value) is not int or not lo <= value <= hi:
            raise CronError(
                f"{FIELD_NAMES[index]} field: {value!r} is not a whole number in {lo}-{hi}",
                field=FIELD_NAMES[index],
                token=repr(value),
            )
        mask |= 1 << value
    if not mask:
        raise CronError(f"{FIELD_NAMES[index]} field: no values", field=FIELD_NAMES[index])
    return mask


def from_value_sets(
    spec: str,
    *,
    minutes: Iterable[int],
    hours: Iterable[int],
    days_of_month: Iterable[int],
    months: Iterable[int],
    days_of_week: Iterable[int],
    day_or: bool,
    fixed_time: bool,
) -> Schedule:
    """A schedule from already-expanded value sets (day of week 0-6, Sunday = 0), for schedules
    another system parsed (Celery's ``crontab``).

    ``day_or`` is the day rule: True ORs day-of-month and day-of-week (cronie, when both are
    restricted), False ANDs them. ``fixed_time`` picks the DST rule of :meth:`Schedule.next`;
    callers with their own DST rule use :meth:`Schedule.next_wall`, which has none. ``spec`` is
    the text ``repr``, ``describe`` and pickling show (pickling re-parses it, so a schedule built
    here pickles only if ``spec`` is a valid cron spec with the same meaning).
    """
    masks = [
        _set_mask(values, index)
        for index, values in enumerate((minutes, hours, days_of_month, months, days_of_week))
    ]
    return Schedule._build(spec, masks, day_or=day_or, wildcard=not fixed_time)


def _day_masks(dom: int, dow: int, day_or: bool) -> tuple[int, ...]:
    """Matching days (bit d = day d) per month shape, indexed ``weekday_of_1st * 4 + len - 28``.

    ``weekday_of_1st`` is ``date.weekday()`` of the 1st (Monday = 0).
    """
    table = []
    for weekday in range(7):
        first = (weekday + 1) % 7  # Sunday-based weekday of the 1st; day d is (first + d - 1) % 7
        week = ((dow >> first) | (dow << (7 - first))) & 0x7F  # bit d - 1: day d, for d in 1..7
        dow_days = (week << 1) * _FIVE_WEEKS & _ALL_DAYS  # the same pattern every 7 days
        days = (dom | dow_days) if day_or else (dom & dow_days)
        table += [days & _MONTH_DAYS[length] for length in (28, 29, 30, 31)]
    return tuple(table)


class Schedule:
    """A parsed cron spec. Immutable and hashable; equal when the meaning is equal.

    ``spec`` is the text as given. Build one with :func:`parse` (or ``Schedule(spec)``, the
    same thing).
    """

    __slots__ = (
        "_daytab",
        "_first_hour",
        "_first_minute",
        "_first_month",
        "_hours",
        "_key",
        "_minutes",
        "_months",
        "_never",
        "_wildcard",
        "spec",
    )

    spec: str
    _minutes: int
    _hours: int
    _months: int
    _wildcard: bool
    _daytab: tuple[int, ...]
    _first_minute: int
    _first_hour: int
    _first_month: int
    _never: bool
    _key: tuple[Any, ...]

    def __new__(cls, spec: str) -> Schedule:
        """``Schedule(spec)`` is ``parse(spec)``."""
        return parse(spec)

    @classmethod
    def _build(cls, spec: str, masks: list[int], *, day_or: bool, wildcard: bool) -> Schedule:
        self = object.__new__(cls)
        minutes, hours, dom, months, dow = masks
        daytab = _day_masks(dom, dow, day_or)
        # Every month shape occurs (the 400-year cycle has each weekday of the 1st for every
        # month, leap Februaries included), so the spec fires iff some shape has a day.
        fits = [0, 0, 0, 0]  # by month length - 28: days that match with some weekday of the 1st
        for i, days in enumerate(daytab):
            fits[i & 3] |= days
        never = not (
            (months & _LONG_MONTHS and fits[3])
            or (months & _SHORT_MONTHS and fits[2])
            or (months & _FEBRUARY and fits[1])
        )
        if never:
            key: tuple[Any, ...] = ("never",)
        elif day_or and (dom == 0xFFFFFFFE or dow == 0x7F):
            key = (minutes, hours, 0xFFFFFFFE, months, 0x7F, False, wildcard)  # every day
        else:
            key = (minutes, hours, dom, months, dow, day_or, wildcard)
        values = {
            "spec": spec,
            "_minutes": minutes,
            "_hours": hours,
            "_months": months,
            "_wildcard": wildcard,
            "_daytab": daytab,
            "_first_minute": _low(minutes),
            "_first_hour": _low(hours),
            "_first_month": _low(months),
            "_never": never,
            "_key": key,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        return self

    # -- value semantics ------------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Schedule is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Schedule is immutable (cannot delete {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Schedule({self.spec!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (parse, (self.spec,))

    @property
    def never(self) -> bool:
        """True when no minute can ever match (``0 0 30 2 *``); ``next`` is then ``None``."""
        return self._never

    @property
    def fixed_time(self) -> bool:
        """True unless the minute or hour field starts with ``*`` (the DST rule keys on it)."""
        return not self._wildcard

    def describe(self, tz: tzinfo | str | None = None) -> str:
        """The spec for ``schedule list``: ``"0 9-17 * * 1-5"``, with the zone if given."""
        text = " ".join(self.spec.split())
        if tz is None:
            return text
        return f"{text} ({getattr(tz, 'key', None) or tz})"

    # -- matching -------------------------------------------------------------------------------

    def _day_mask(self, year: int, month: int) -> int:
        length = _DAYS_IN_MONTH[month]
        if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
            length = 29
        return self._daytab[date(year, month, 1).weekday() * 4 + length - 28]

    def _wall_matches(self, year: int, month: int, day: int, hour: int, minute: int) -> bool:
        return bool(
            self._minutes >> minute & 1
            and self._hours >> hour & 1
            and self._months >> month & 1
            and self._day_mask(year, month) >> day & 1
        )

    def _next_wall(
        self, year: int, month: int, day: int, hour: int, minute: int
    ) -> tuple[int, int, int, int, int] | None:
        """Earliest matching wall-clock minute at or after the given one (``minute`` may be 60).

        Fields are plain ints, so no calendar arithmetic is needed: the masks say where the next
        match is. ``None`` past year 9999 (``datetime``'s limit) or when nothing ever matches.
        """
        months = self._months
        if months >> month & 1:
            days = self._day_mask(year, month)
            if days >> day & 1:
                hours = self._hours >> hour << hour
                if hours:
                    next_hour = _low(hours)
                    if next_hour != hour:
                        return year, month, day, next_hour, self._first_minute
                    minutes = self._minutes >> minute << minute
                    if minutes:
                        return year, month, day, hour, _low(minutes)
                    hours = hours >> (hour + 1) << (hour + 1)
                    if hours:
                        return year, month, day, _low(hours), self._first_minute
                day += 1
            days = days >> day << day
            if days:
                return year, month, _low(days), self._first_hour, self._first_minute
        if self._never:
            return None
        while True:
            later = months >> (month + 1) << (month + 1)
            if later:
                month = _low(later)
            else:
                year += 1
                if year > _MAX_YEAR:
                    return None
                month = self._first_month
            days = self._day_mask(year, month)
            if days:
                return year, month, _low(days), self._first_hour, self._first_minute

    def next_wall(self, wall: datetime) -> datetime | None:
        """The earliest matching wall-clock minute at or after the naive ``wall`` (seconds round
        up), naive, with no timezone rule at all: for callers that map wall times to instants
        by their own DST rule. ``None`` when nothing matches before year 10000."""
        if wall.tzinfo is not None:
            raise ValueError(f"wall must be a naive wall-clock time, got {wall.isoformat()}")
        minute = wall.minute + (1 if wall.second or wall.microsecond else 0)
        found = self._next_wall(wall.year, wall.month, wall.day, wall.hour, minute)
        return None if found is None else datetime(*found)

    def matches(self, t: datetime) -> bool:
        """Whether the schedule fires in the minute of ``t``, read in ``t``'s own timezone.

        Across DST this follows the rules in the module docstring: the first minute after a
        spring-forward gap matches a fixed-time job whose time was skipped, and the repeated
        pass of a fall-back overlap never matches a fixed-time job.
        """
        require_aware(t, "t")
        tz = t.tzinfo
        if type(tz) is timezone or getattr(tz, "key", None) in _FIXED_ZONES:
            return self._wall_matches(t.year, t.month, t.day, t.hour, t.minute)
        local = t.astimezone(_UTC).astimezone(tz)
        if self._wall_matches(local.year, local.month, local.day, local.hour, local.minute):
            if local.fold and not self._wildcard:  # the repeated pass of an overlap
                back = local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]  # aware
                return back > _DST_LIMIT  # not DST: cronie follows the wall clock
            return True
        if self._wildcard:
            return False
        local = local.replace(second=0, microsecond=0)
        if (local - _MINUTE).utcoffset() == local.utcoffset():
            return False  # the wall minute before exists with the same offset: not after a gap
        return self._gap_catch_up(local)

    def _gap_catch_up(self, local: datetime) -> bool:
        """Whether ``local`` (canonical, whole minute) is the first minute after a DST gap in
        which a wall-clock time of this (fixed-time) schedule was skipped."""
        before = (local.astimezone(_UTC) - _MINUTE).astimezone(local.tzinfo)
        offset, previous = local.utcoffset(), before.utcoffset()
        assert offset is not None and previous is not None
        if previous >= offset or offset - previous >= _DST_LIMIT:
            return False
        wall = local.replace(tzinfo=None)
        gap_start = wall - (offset - previous)
        found = self._next_wall(
            gap_start.year, gap_start.month, gap_start.day, gap_start.hour, gap_start.minute
        )
        return found is not None and datetime(*found) < wall

    # -- next -----------------------------------------------------------------------------------

    def next(self, t: datetime) -> datetime | None:
        """The earliest minute start ``>= t`` at which the schedule fires, in ``t``'s timezone.

        A whole-minute ``t`` that fires is returned itself; seconds and microseconds round up
        to the next minute start. ``None`` only when the spec can never fire (or not before
        year 10000). Naive ``t`` raises ``ValueError``.
        """
        require_aware(t, "t")
        tz = t.tzinfo
        if type(tz) is not timezone and getattr(tz, "key", None) not in _FIXED_ZONES:
            return self._next_zoned(t, tz)  # type: ignore[arg-type]  # aware: require_aware
        minute = t.minute
        if t.second or t.microsecond:
            minute += 1  # may be 60: _next_wall carries it
        elif self._wall_matches(t.year, t.month, t.day, t.hour, minute):
            return t
        found = self._next_wall(t.year, t.month, t.day, t.hour, minute)
        if found is None:
            return None
        year, month, day, hour, minute = found
        return datetime(year, month, day, hour, minute, 0, 0, tz)  # positional: keywords cost more

    def next_after(self, t: datetime) -> datetime | None:
        """The first firing strictly after ``t``, in ``t``'s timezone: ``next`` of the minute
        that starts one real (not wall-clock) minute after the start of ``t``'s minute.

        This is how to walk the firings: ``fire = schedule.next_after(fire)``.
        """
        require_aware(t, "t")
        tz = t.tzinfo
        if type(tz) is timezone or getattr(tz, "key", None) in _FIXED_ZONES:
            return self.next(t.replace(second=0, microsecond=0) + _MINUTE)
        instant = t.astimezone(_UTC).replace(second=0, microsecond=0) + _MINUTE
        return self.next(instant.astimezone(tz))

    def _next_zoned(self, t: datetime, tz: tzinfo) -> datetime | None:
        """``next`` for a zone with transitions: search wall-clock time, then map to instants."""
        if self._never:
            return None
        instant = t.astimezone(_UTC)
        if instant.second or instant.microsecond:
            instant = instant.replace(second=0, microsecond=0) + _MINUTE
        local = instant.astimezone(tz)  # canonical wall time, fold set on the repeated pass
        if not local.fold:
            # Common case, decided with a few utcoffset calls: t's wall time exists once, t is not
            # the first minute after a gap (which matters to fixed-time jobs only), and the first
            # matching wall time exists once. Then nothing can fire between t and it: a skipped
            # or repeated wall time in between would be >= t's and < the match, so not matching.
            offset = local.utcoffset()
            if local.replace(fold=1).utcoffset() == offset and (
                self._wildcard or (local - _MINUTE).utcoffset() == offset
            ):
                found = self._next_wall(
                    local.year, local.month, local.day, local.hour, local.minute
                )
                if found is None:
                    return None
                year, month, day, hour, minute = found
                result = datetime(year, month, day, hour, minute, 0, 0, tz)
                if result.utcoffset() == result.replace(fold=1).utcoffset():
                    return result
        return self._next_zoned_slow(local, tz)

    def _next_zoned_slow(self, local: datetime, tz: tzinfo) -> datetime | None:
        """``next`` from a canonical whole-minute ``local`` near a transition, or whose answer is
        in a gap or an overlap."""
        fixed = not self._wildcard
        wall = local.replace(tzinfo=None)
        if fixed and self._gap_catch_up(local):
            return local
        off0, off1 = _offsets(wall, tz)
        if off0 > off1:  # wall is in a fall-back overlap
            _, end = _transition(wall, tz, off0, off1)  # end: first wall after the overlap
            start = end - (off0 - off1)  # first wall of the overlap
            if not local.fold:
                found = self._next_wall_dt(wall)
                if found is not None and found < end:
                    return found.replace(tzinfo=tz)
            if not fixed or off0 - off1 > _DST_LIMIT:  # wildcard jobs fire in both passes
                found = self._next_wall_dt(wall if local.fold else start)
                if found is not None and found < end:
                    return found.replace(tzinfo=tz, fold=1)
            wall = end
        while True:
            found = self._next_wall_dt(wall)
            if found is None:
                return None
            off0, off1 = _offsets(found, tz)
            if off0 >= off1:  # exists (first pass if repeated)
                return found.replace(tzinfo=tz)
            transition, gap_end = _transition(found, tz, off0, off1)
            if fixed and off1 - off0 < _DST_LIMIT:  # run a skipped fixed-time job after the gap
                return transition.astimezone(tz)
            wall = gap_end

    def _next_wall_dt(self, wall: datetime) -> datetime | None:
        found = self._next_wall(wall.year, wall.month, wall.day, wall.hour, wall.minute)
        return None if found is None else datetime(*found)


def _offsets(wall: datetime, tz: tzinfo) -> tuple[timedelta, timedelta]:
    """UTC offsets of a naive wall time read with ``fold=0`` and ``fold=1``.

    Equal: the wall time exists once. ``off0 > off1``: it is repeated (fall-back overlap).
    ``off0 < off1``: it does not exist (spring-forward gap). This is PEP 495's convention, which
    zoneinfo follows.
    """
    off0 = tz.utcoffset(wall.replace(tzinfo=tz, fold=0))
    off1 = tz.utcoffset(wall.replace(tzinfo=tz, fold=1))
    assert off0 is not None and off1 is not None
    return off0, off1


def _transition(
    wall: datetime, tz: tzinfo, off0: timedelta, off1: timedelta
) -> tuple[datetime, datetime]:
    """For a wall time in a gap or overlap: the transition instant (UTC) and the first wall
    time after the gap or overlap.

    The transition lies between the two readings of ``wall``; bisect it to the minute.
    """
    naive_utc = wall.replace(tzinfo=_UTC)
    lo = naive_utc - max(off0, off1)  # before the transition: offset off0
    hi = naive_utc - min(off0, off1)  # at or after it: offset off1
    while hi - lo > _MINUTE:
        mid = lo + (hi - lo) // 2
        mid = mid.replace(second=0, microsecond=0)
        if mid <= lo:
            mid = lo + _MINUTE
        if mid.astimezone(tz).utcoffset() == off0:
            lo = mid
        else:
            hi = mid
    return hi, (hi + max(off0, off1)).replace(tzinfo=None)
