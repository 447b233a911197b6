"""DST, as cronie does it (man 8 cron, "Daylight Saving Time and other time changes").

2026 transitions used (from the tz database):
- Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (02:00-02:59 do not exist);
  2026-10-25 03:00 CEST -> 02:00 CET (02:00-02:59 happen twice).
- America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
- Australia/Lord_Howe: 2026-10-04 02:00 -> 02:30 (+10:30 -> +11:00), a half-hour gap.

Fixed-time job (minute and hour fields do not start with '*'): in a gap it fires once, at the
first minute after the gap; in an overlap it fires once, at the first occurrence. Wildcard job:
follows the wall clock -- nothing in a gap, both passes of an overlap.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling_core.cron import parse

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
MINUTE = timedelta(minutes=1)


def local(tz: ZoneInfo, y: int, mo: int, d: int, h: int, mi: int, fold: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=tz, fold=fold)


def walk(spec: str, start: datetime, count: int) -> list[str]:
    """The first ``count`` firings from ``start``, by calling next(previous + 1 minute) as beat
    does, rendered with their UTC offset so the two passes of an overlap differ."""
    schedule = parse(spec)
    tz = start.tzinfo
    out = []
    t = start
    for _ in range(count):
        fired = schedule.next(t)
        assert fired is not None
        assert fired.tzinfo is tz
        assert schedule.matches(fired)
        out.append(fired.strftime("%m-%d %H:%M%z"))
        t = (fired.astimezone(UTC) + MINUTE).astimezone(tz)  # one real minute later
    return out


# -- spring forward ----------------------------------------------------------------------------


def test_berlin_spring_fixed_time_fires_at_first_minute_after_the_gap() -> None:
    start = local(BERLIN, 2026, 3, 28, 0, 0)
    assert walk("30 2 * * *", start, 3) == [
        "03-28 02:30+0100",
        "03-29 03:00+0200",  # 02:30 does not exist: first minute after the gap
        "03-30 02:30+0200",
    ]


def test_berlin_spring_fixed_time_next_at_gap_end_returns_itself() -> None:
    schedule = parse("30 2 * * *")
    gap_end = local(BERLIN, 2026, 3, 29, 3, 0)
    assert schedule.next(gap_end) == gap_end
    assert schedule.matches(gap_end)
    assert schedule.matches(gap_end + timedelta(seconds=59))
    assert not schedule.matches(local(BERLIN, 2026, 3, 29, 3, 1))
    assert not schedule.matches(local(BERLIN, 2026, 3, 29, 1, 59))
    assert schedule.next(local(BERLIN, 2026, 3, 29, 3, 1)) == local(BERLIN, 2026, 3, 30, 2, 30)


def test_berlin_spring_several_skipped_times_collapse_into_one_firing() -> None:
    start = local(BERLIN, 2026, 3, 29, 0, 0)
    assert walk("0,30 2 * * *", start, 3) == [
        "03-29 03:00+0200",
        "03-30 02:00+0200",
        "03-30 02:30+0200",
    ]
    # a match at the gap's end itself is the same instant: one firing, not two
    assert walk("0 2,3 * * *", start, 3) == [
        "03-29 03:00+0200",
        "03-30 02:00+0200",
        "03-30 03:00+0200",
    ]
    # an hour range is fixed-time too (neither field starts with '*')
    assert walk("15 1-3 * * *", start, 3) == [
        "03-29 01:15+0100",
        "03-29 03:00+0200",  # 02:15 skipped: caught up at 03:00
        "03-29 03:15+0200",
    ]


def test_berlin_spring_wildcard_jobs_follow_the_wall_clock() -> None:
    start = local(BERLIN, 2026, 3, 29, 1, 0)
    assert walk("*/30 * * * *", start, 4) == [
        "03-29 01:00+0100",
        "03-29 01:30+0100",
        "03-29 03:00+0200",  # 02:00 and 02:30 do not exist
        "03-29 03:30+0200",
    ]
    assert walk("30 * * * *", start, 2) == ["03-29 01:30+0100", "03-29 03:30+0200"]
    # a job in the skipped hour with a '*' minute simply does not run that day
    assert walk("* 2 * * *", local(BERLIN, 2026, 3, 29, 0, 0), 1) == ["03-30 02:00+0200"]
    assert not parse("*/15 2 * * *").matches(local(BERLIN, 2026, 3, 29, 3, 0))


def test_new_york_spring() -> None:
    start = local(NEW_YORK, 2026, 3, 7, 12, 0)
    assert walk("30 2 * * *", start, 3) == [
        "03-08 03:00-0400",
        "03-09 02:30-0400",
        "03-10 02:30-0400",
    ]
    assert walk("*/20 2 * * *", start, 4) == [
        "03-09 02:00-0400",  # 03-08 02:xx does not exist
        "03-09 02:20-0400",
        "03-09 02:40-0400",
        "03-10 02:00-0400",
    ]
    assert walk("0 * * * *", local(NEW_YORK, 2026, 3, 8, 0, 30), 3) == [
        "03-08 01:00-0500",
        "03-08 03:00-0400",
        "03-08 04:00-0400",
    ]


def test_lord_howe_half_hour_gap() -> None:
    start = local(LORD_HOWE, 2026, 10, 4, 0, 0)
    assert walk("15 2 * * *", start, 2) == ["10-04 02:30+1100", "10-05 02:15+1100"]
    assert walk("*/20 2 * * *", start, 3) == [
        "10-04 02:40+1100",  # 02:00 and 02:20 do not exist
        "10-05 02:00+1100",
        "10-05 02:20+1100",
    ]


# -- fall back ---------------------------------------------------------------------------------


def test_berlin_fall_fixed_time_fires_once_at_the_first_occurrence() -> None:
    start = local(BERLIN, 2026, 10, 24, 12, 0)
    assert walk("30 2 * * *", start, 3) == [
        "10-25 02:30+0200",
        "10-26 02:30+0100",  # not 10-25 02:30+0100, the repeated pass
        "10-27 02:30+0100",
    ]
    schedule = parse("30 2 * * *")
    assert not schedule.matches(local(BERLIN, 2026, 10, 25, 2, 30, fold=1))
    assert schedule.matches(local(BERLIN, 2026, 10, 25, 2, 30, fold=0))
    # asked from inside the repeated pass, the answer is the next day
    second_pass = local(BERLIN, 2026, 10, 25, 2, 0, fold=1)
    assert schedule.next(second_pass) == local(BERLIN, 2026, 10, 26, 2, 30)


def test_berlin_fall_wildcard_jobs_fire_in_both_passes() -> None:
    start = local(BERLIN, 2026, 10, 25, 1, 45)
    assert walk("*/30 2 * * *", start, 5) == [
        "10-25 02:00+0200",
        "10-25 02:30+0200",
        "10-25 02:00+0100",
        "10-25 02:30+0100",
        "10-26 02:00+0100",
    ]
    fired = parse("*/30 2 * * *").next(local(BERLIN, 2026, 10, 25, 2, 31))
    assert fired is not None and fired.fold == 1 and fired.utcoffset() == timedelta(hours=1)


def test_new_york_fall_fixed_time_after_first_fire_is_the_next_day() -> None:
    schedule = parse("30 1 * * *")
    first = schedule.next(local(NEW_YORK, 2026, 11, 1, 0, 0))
    assert first == local(NEW_YORK, 2026, 11, 1, 1, 30)
    assert first is not None and first.utcoffset() == timedelta(hours=-4)
    after = schedule.next(local(NEW_YORK, 2026, 11, 1, 1, 31))  # 01:31 EDT
    assert after is not None
    assert after.astimezone(UTC) == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)  # 01:30 EST, 11-02


def test_new_york_fall_hour_range_is_fixed_time() -> None:
    start = local(NEW_YORK, 2026, 11, 1, 0, 30)
    assert walk("0 1-3 * * *", start, 4) == [
        "11-01 01:00-0400",
        "11-01 02:00-0500",  # no 01:00-0500
        "11-01 03:00-0500",
        "11-02 01:00-0500",
    ]


def test_new_york_fall_wildcard_hourly() -> None:
    start = local(NEW_YORK, 2026, 11, 1, 0, 0)
    assert walk("@hourly", start, 4) == [
        "11-01 00:00-0400",
        "11-01 01:00-0400",
        "11-01 01:00-0500",
        "11-01 02:00-0500",
    ]
    assert walk("@daily", start, 2) == ["11-01 00:00-0400", "11-02 00:00-0500"]


def test_a_nonexistent_input_time_is_read_as_zoneinfo_reads_it() -> None:
    # 02:30 on the Berlin spring-forward day does not exist; with fold=0 zoneinfo reads it with
    # the old offset, which is 01:30 UTC, i.e. 03:30 CEST.
    imaginary = local(BERLIN, 2026, 3, 29, 2, 30)
    assert parse("* * * * *").next(imaginary) == local(BERLIN, 2026, 3, 29, 3, 30)


# -- matches and next describe the same instants, minute by minute, around every transition ---

TRANSITIONS = [
    (BERLIN, datetime(2026, 3, 29, 0, 0, tzinfo=UTC)),
    (BERLIN, datetime(2026, 10, 24, 23, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2026, 3, 8, 5, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2026, 11, 1, 4, 0, tzinfo=UTC)),
    (LORD_HOWE, datetime(2026, 10, 3, 14, 0, tzinfo=UTC)),
    (LORD_HOWE, datetime(2026, 4, 4, 13, 0, tzinfo=UTC)),
]
SPECS = [
    "* * * * *",
    "*/7 * * * *",
    "30 2 * * *",
    "0,30 1-3 * * *",
    "15 */2 * * *",
    "* 2 * * *",
    "*/20 1 * * *",
    "45 0-4 * * 0",
    "59 1 * * *",
    "0 3 * * *",
    "0 2 * * *",
    "@hourly",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("tz", "start"), TRANSITIONS, ids=lambda v: str(v))
def test_matches_and_next_walk_the_same_instants(spec: str, tz: ZoneInfo, start: datetime) -> None:
    schedule = parse(spec)
    span = timedelta(hours=6)
    by_matches = []
    u = start
    while u < start + span:
        if schedule.matches(u.astimezone(tz)):
            by_matches.append(u)
        u += MINUTE
    by_next = []
    u = start
    while True:
        fired = schedule.next(u.astimezone(tz))
        assert fired is not None
        if fired.astimezone(UTC) >= start + span:
            break
        by_next.append(fired.astimezone(UTC))
        u = fired.astimezone(UTC) + MINUTE
    assert by_next == by_matches
