"""Hand-worked vectors: (spec, start, expected next), all in UTC.

Every expected value below was worked out from cronie's rules and a calendar, not copied from a
library. Calendar facts used: 2026-01-01 is a Thursday, 2026-01-04 a Sunday, 2026-01-05 and
2026-02-02 Mondays, 2027-01-01 a Friday, 2028-02-29 a Tuesday, 2032-02-29 and 2060-02-29 Sundays,
2100 is not a leap year, so the leap day after 2096-02-29 is 2104-02-29.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from scheduling_core.cron import Schedule, parse


def at(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


VECTORS: list[tuple[str, datetime, datetime | None]] = [
    # -- '*' and rounding: a matching whole minute is its own next; seconds round up
    ("* * * * *", at(2026, 1, 1), at(2026, 1, 1)),
    ("* * * * *", at(2026, 1, 1, 0, 0, 30), at(2026, 1, 1, 0, 1)),
    ("* * * * *", at(2026, 1, 1, 0, 0, 0, 1), at(2026, 1, 1, 0, 1)),
    ("* * * * *", at(2026, 12, 31, 23, 59, 1), at(2027, 1, 1)),
    # -- single values, hour rollover, day rollover
    ("0 0 * * *", at(2026, 1, 1, 0, 0, 0, 1), at(2026, 1, 2)),
    ("30 * * * *", at(2026, 1, 1, 5, 31), at(2026, 1, 1, 6, 30)),
    ("0 12 * * *", at(2026, 1, 1, 12, 1), at(2026, 1, 2, 12, 0)),
    # -- */S, A-B, A-B/S, N/S, lists
    ("*/15 * * * *", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 0, 15)),
    ("*/15 * * * *", at(2026, 1, 1, 23, 46), at(2026, 1, 2)),
    ("0 */5 * * *", at(2026, 1, 1, 20, 1), at(2026, 1, 2)),  # hours 0,5,10,15,20
    ("10-12 * * * *", at(2026, 1, 1, 0, 13), at(2026, 1, 1, 1, 10)),
    ("5-20/5 * * * *", at(2026, 1, 1, 0, 21), at(2026, 1, 1, 1, 5)),
    ("5-20/5 * * * *", at(2026, 1, 1, 0, 11), at(2026, 1, 1, 0, 15)),
    ("10/20 * * * *", at(2026, 1, 1, 0, 31), at(2026, 1, 1, 0, 50)),  # 10-59/20: 10,30,50
    ("10/20 * * * *", at(2026, 1, 1, 0, 51), at(2026, 1, 1, 1, 10)),
    ("0 20/3 * * *", at(2026, 1, 1, 21), at(2026, 1, 1, 23)),  # 20-23/3: 20,23
    ("1,2,5-7,40-50/10 * * * *", at(2026, 1, 1, 0, 3), at(2026, 1, 1, 0, 5)),
    ("1,2,5-7,40-50/10 * * * *", at(2026, 1, 1, 0, 41), at(2026, 1, 1, 0, 50)),
    ("1,2,5-7,40-50/10 * * * *", at(2026, 1, 1, 0, 51), at(2026, 1, 1, 1, 1)),
    ("3-3 * * * *", at(2026, 1, 1, 0, 4), at(2026, 1, 1, 1, 3)),  # 3-3 is just 3
    ("*/100 * * * *", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 1, 0)),  # a big step keeps the start
    ("0 0 */10 * *", at(2026, 1, 1, 0, 1), at(2026, 1, 11)),  # days 1,11,21,31
    ("0 0 */10 * *", at(2026, 2, 21, 0, 1), at(2026, 3, 1)),  # February has no 31st
    # -- month and year rollovers
    ("0 0 1 * *", at(2026, 1, 1, 0, 1), at(2026, 2, 1)),
    ("0 0 31 * *", at(2026, 4, 1), at(2026, 5, 31)),  # April has 30 days
    ("0 0 31 * *", at(2026, 1, 31, 0, 1), at(2026, 3, 31)),
    ("59 23 31 12 *", at(2026, 12, 31, 23, 59, 1), at(2027, 12, 31, 23, 59)),
    ("0 0 1 1 *", at(2026, 1, 1, 0, 1), at(2027, 1, 1)),
    ("0 0 * 3 *", at(2026, 3, 31, 0, 1), at(2027, 3, 1)),
    # -- names, case-insensitive, in ranges and lists
    ("0 0 1 jul *", at(2026, 1, 1), at(2026, 7, 1)),
    ("0 0 1 Jul,DEC *", at(2026, 7, 1, 0, 1), at(2026, 12, 1)),
    ("0 12 * jan-mar mon-fri", at(2026, 3, 31, 12, 1), at(2027, 1, 1, 12)),
    ("5 4 * * sun", at(2026, 1, 1), at(2026, 1, 4, 4, 5)),
    ("5 4 * * 0", at(2026, 1, 1), at(2026, 1, 4, 4, 5)),
    ("5 4 * * 7", at(2026, 1, 1), at(2026, 1, 4, 4, 5)),  # 7 is Sunday too
    ("0 0 * * fri-sun", at(2026, 1, 1), at(2026, 1, 2)),  # FRI-SUN = 5-7
    ("0 0 * * fri-sun", at(2026, 1, 4, 0, 1), at(2026, 1, 9)),  # after Sunday: next Friday
    ("0 0 * * 5-0", at(2026, 1, 3, 0, 1), at(2026, 1, 4)),  # 5-0 = 5-7: Sunday included
    ("0 0 * * sun-sun", at(2026, 1, 1), at(2026, 1, 4)),  # starts at Sunday: not 0-7
    ("0 0 * * 0-0", at(2026, 1, 1), at(2026, 1, 4)),
    ("0 0 * * 1/2", at(2026, 1, 3, 0, 1), at(2026, 1, 4)),  # 1-7/2 = 1,3,5,7: Sunday
    ("0 0 * * */2", at(2026, 1, 1, 0, 1), at(2026, 1, 3)),  # 0,2,4,6: Sat Jan 3
    ("0 9-17 * * 1-5", at(2026, 1, 1), at(2026, 1, 1, 9)),
    ("0 9-17 * * 1-5", at(2026, 1, 2, 17, 1), at(2026, 1, 5, 9)),  # Friday evening -> Monday
    # -- macros
    ("@yearly", at(2026, 1, 1, 0, 1), at(2027, 1, 1)),
    ("@annually", at(2026, 1, 1, 0, 1), at(2027, 1, 1)),
    ("@monthly", at(2026, 1, 1, 0, 1), at(2026, 2, 1)),
    ("@weekly", at(2026, 1, 1), at(2026, 1, 4)),
    ("@daily", at(2026, 1, 1, 0, 1), at(2026, 1, 2)),
    ("@midnight", at(2026, 1, 1, 0, 1), at(2026, 1, 2)),
    ("@hourly", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 1)),
    ("@HOURLY", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 1)),
    # -- the day rule: both restricted -> OR
    ("0 0 13 * 5", at(2026, 1, 1), at(2026, 1, 2)),  # Friday the 2nd
    ("0 0 13 * 5", at(2026, 1, 10), at(2026, 1, 13)),  # Tuesday the 13th
    ("0 0 13 * 5", at(2026, 1, 13, 0, 1), at(2026, 1, 16)),  # then Friday the 16th
    ("0 0 1,15 * 3", at(2026, 1, 2), at(2026, 1, 7)),  # a Wednesday before the 15th
    ("0 0 1-31 * 1", at(2026, 1, 1), at(2026, 1, 1)),  # 1-31 is restricted: every day
    ("0 0 30 2 1", at(2026, 1, 1), at(2026, 2, 2)),  # Feb 30 never, but Mondays in Feb do
    ("0 0 29 2 1", at(2026, 2, 23, 0, 1), at(2027, 2, 1)),
    # -- the day rule: a field starting with '*' -> AND
    ("0 0 */2 * 1", at(2026, 1, 1), at(2026, 1, 5)),  # odd days that are Mondays
    ("0 0 */2 * 1", at(2026, 1, 5, 0, 1), at(2026, 1, 19)),  # the 12th is even
    ("0 0 */2 * 1", at(2026, 1, 26, 0, 1), at(2026, 2, 9)),
    ("0 0 * * 1", at(2026, 1, 1), at(2026, 1, 5)),
    ("0 0 1 * */2", at(2026, 1, 1), at(2026, 1, 1)),  # Thursday the 1st is day 4
    ("0 0 13 * */7", at(2026, 1, 1), at(2026, 9, 13)),  # a 13th that is a Sunday
    # -- leap days
    ("0 0 29 2 *", at(2026, 1, 1), at(2028, 2, 29)),
    ("0 0 29 2 *", at(2028, 2, 29, 0, 1), at(2032, 2, 29)),
    ("0 0 29 2 *", at(2096, 3, 1), at(2104, 2, 29)),  # 2100 is not a leap year
    ("0 0 29 2 */7", at(2026, 1, 1), at(2032, 2, 29)),  # Feb 29 on a Sunday
    ("0 0 29 2 */7", at(2032, 3, 1), at(2060, 2, 29)),  # 28 years away
    ("0 0 29 * *", at(2026, 2, 1), at(2026, 3, 29)),
    # -- never
    ("0 0 30 2 *", at(2026, 1, 1), None),
    ("0 0 31 4,6,9,11 *", at(2026, 1, 1), None),
    ("0 0 30-31 feb *", at(2026, 1, 1), None),
    ("0 0 30 2 */7", at(2026, 1, 1), None),
]


@pytest.mark.parametrize(("spec", "start", "expected"), VECTORS)
def test_vector(spec: str, start: datetime, expected: datetime | None) -> None:
    schedule = parse(spec)
    got = schedule.next(start)
    assert got == expected
    if expected is not None:
        assert got is not None
        assert got.tzinfo is start.tzinfo
        assert schedule.matches(got)
        assert not schedule.never
    else:
        assert schedule.never


def test_next_keeps_fixed_offset() -> None:
    plus2 = timezone(timedelta(hours=2))
    got = parse("0 9 * * *").next(datetime(2026, 1, 1, 10, tzinfo=plus2))
    assert got == datetime(2026, 1, 2, 9, tzinfo=plus2)
    assert got is not None and got.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(("key", "hours"), [("UTC", 0), ("Etc/UTC", 0), ("Etc/GMT-2", 2)])
def test_fixed_offset_zoneinfo_zones_agree_with_datetime_timezone(key: str, hours: int) -> None:
    zone, fixed = ZoneInfo(key), timezone(timedelta(hours=hours))
    for spec, start, _ in VECTORS:
        schedule = parse(spec)
        ours = schedule.next(start.astimezone(zone))
        expected = schedule.next(start.astimezone(fixed))
        assert ours == expected
        assert ours is None or ours.tzinfo is zone
        assert schedule.matches(start.astimezone(zone)) == schedule.matches(start.astimezone(fixed))


def test_matches_reads_the_minute_of_t() -> None:
    schedule = parse("30 9 * * 1-5")
    assert schedule.matches(at(2026, 1, 2, 9, 30, 59, 999999))  # Friday, any second of 09:30
    assert not schedule.matches(at(2026, 1, 2, 9, 31))
    assert not schedule.matches(at(2026, 1, 3, 9, 30))  # Saturday


def test_naive_datetimes_are_refused() -> None:
    schedule = parse("* * * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.matches(datetime(2026, 1, 1))


def test_value_semantics() -> None:
    weekly = parse("@weekly")
    assert weekly == parse("0 0 * * 0") == parse("0 0 * * 7") == parse("0  0 * *  SUN")
    assert hash(weekly) == hash(parse("0 0 * * sun"))
    assert parse("0 0 * * *") == parse("0 0 */1 * *") == parse("0 0 1-31 * 0-6")
    assert parse("0 0 * * *") != parse("*/60 0 * * *")  # same minutes, different DST rule
    assert parse("0 0 30 2 *") == parse("0 0 31 4 *")  # both never fire
    assert parse("0 0 13 * 5") != parse("0 0 */13 * 5")  # OR versus AND
    assert repr(weekly) == "Schedule('@weekly')"
    assert weekly.spec == "@weekly"
    assert parse(" 0  9 * * 1-5 ").describe() == "0 9 * * 1-5"
    assert parse("0 9 * * 1-5").describe("Europe/Berlin") == "0 9 * * 1-5 (Europe/Berlin)"
    assert parse("@daily").describe(ZoneInfo("Europe/Berlin")) == "@daily (Europe/Berlin)"
    assert parse("@daily").describe(UTC) == "@daily (UTC)"
    assert parse("*/5 * * * *").fixed_time is False and parse("0 9 * * *").fixed_time is True
    assert parse("@hourly").fixed_time is False and parse("@daily").fixed_time is True
    assert len({weekly, parse("0 0 * * 0"), parse("@daily")}) == 2
    with pytest.raises(AttributeError):
        weekly.spec = "x"
    assert Schedule("@weekly") == weekly and Schedule("@weekly").spec == "@weekly"


def test_pickle_round_trip() -> None:
    import pickle

    schedule = parse("0 9-17 * * mon-fri")
    clone = pickle.loads(pickle.dumps(schedule))
    assert clone == schedule and clone.spec == schedule.spec


def test_datetime_limit_is_none_not_a_crash() -> None:
    # 9996 is the last leap year datetime can hold.
    assert parse("0 0 29 2 *").next(at(9996, 3, 1)) is None
