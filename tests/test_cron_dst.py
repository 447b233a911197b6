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
    """The first ``count`` firings from ``start``, by calling next(previous + 1 real minute),
    rendered with their UTC offset so the two passes of an overlap differ. ``next_after`` must
    walk the same sequence."""
    schedule = parse(spec)
    tz = start.tzinfo
    out = []
    t = start
    previous = None
    for _ in range(count):
        fired = schedule.next(t)
        assert fired is not None
        assert fired.tzinfo is tz
        assert schedule.matches(fired)
        if previous is not None:
            assert schedule.next_after(previous) == fired
            assert schedule.next_after(previous).utcoffset() == fired.utcoffset()
        out.append(fired.strftime("%m-%d %H:%M%z"))
        t = (fired.astimezone(UTC) + MINUTE).astimezone(tz)  # one real minute later
        previous = fired
    return out


def test_wall_clock_plus_one_minute_is_the_documented_pitfall() -> None:
    """Aware zoneinfo arithmetic is wall-clock arithmetic and drops fold; next_after is not."""
    every_minute = parse("* * * * *")
    last_edt = local(NEW_YORK, 2026, 11, 1, 1, 59)  # the last minute of the first pass
    after = every_minute.next_after(last_edt)
    assert after is not None and after.fold == 1 and after.strftime("%H:%M%z") == "01:00-0500"
    naive_step = every_minute.next(last_edt + MINUTE)  # wall clock: 02:00 EST, an hour later
    assert naive_step is not None and naive_step.strftime("%H:%M%z") == "02:00-0500"
    # a fixed-time job is immune: it never fires in the repeated pass
    fixed = parse("30 1 * * *")
    first = local(NEW_YORK, 2026, 11, 1, 1, 30)
    assert (
        fixed.next(first + MINUTE) == fixed.next_after(first) == local(NEW_YORK, 2026, 11, 2, 1, 30)
    )


def test_next_after_is_strictly_after_and_rounds() -> None:
    schedule = parse("*/15 * * * *")
    t = local(BERLIN, 2026, 6, 1, 10, 15)
    assert schedule.next_after(t) == local(BERLIN, 2026, 6, 1, 10, 30)
    assert schedule.next_after(t + timedelta(seconds=30)) == local(BERLIN, 2026, 6, 1, 10, 30)
    assert schedule.next_after(t - timedelta(seconds=1)) == t
    utc = datetime(2026, 6, 1, 10, 15, tzinfo=UTC)
    assert schedule.next_after(utc) == datetime(2026, 6, 1, 10, 30, tzinfo=UTC)
    assert schedule.next_after(utc - timedelta(microseconds=1)) == utc


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


# -- transitions at midnight and odd sizes ----------------------------------------------------

SAO_PAULO = ZoneInfo("America/Sao_Paulo")  # 2018-11-04 00:00 -> 01:00; 2019-02-17 00:00 -> 23:00
APIA = ZoneInfo("Pacific/Apia")  # 2011-12-29 23:59 -10:00 -> 2011-12-31 00:00 +14:00


def test_sao_paulo_midnight_gap() -> None:
    start = local(SAO_PAULO, 2018, 11, 3, 12, 0)
    assert walk("0 0 * * *", start, 2) == ["11-04 01:00-0200", "11-05 00:00-0200"]
    assert walk("*/30 0 * * *", start, 2) == ["11-05 00:00-0200", "11-05 00:30-0200"]


def test_sao_paulo_fall_back_across_midnight() -> None:
    start = local(SAO_PAULO, 2019, 2, 16, 22, 0)
    assert walk("30 23 * * *", start, 2) == ["02-16 23:30-0200", "02-17 23:30-0300"]
    assert walk("*/30 23 * * *", start, 5) == [
        "02-16 23:00-0200",
        "02-16 23:30-0200",
        "02-16 23:00-0300",
        "02-16 23:30-0300",
        "02-17 23:00-0300",
    ]
    assert walk("0 0 * * *", start, 2) == ["02-17 00:00-0300", "02-18 00:00-0300"]


def test_apia_skipped_a_whole_day_which_is_not_dst() -> None:
    # Samoa skipped 2011-12-30 (a 24-hour jump). cronie's DST handling covers changes of less
    # than three hours only, so no catch-up: every job follows the wall clock.
    start = local(APIA, 2011, 12, 29, 12, 0)
    assert walk("0 12 * * *", start, 2) == ["12-29 12:00-1000", "12-31 12:00+1400"]
    assert walk("0 12 30 * *", start, 1) == ["01-30 12:00+1400"]
    assert walk("0 * 30 * *", start, 1) == ["01-30 00:00+1400"]
    assert not parse("0 12 30 * *").matches(local(APIA, 2011, 12, 31, 0, 0))


CASEY = ZoneInfo("Antarctica/Casey")  # 2018-03-11 04:00 +11 -> 01:00 +08; 10-07 04:00 -> 07:00


def test_casey_three_hour_changes_follow_cronies_limits() -> None:
    # A 3-hour overlap is still DST for cronie (a jump of -179 minutes): fixed-time jobs once.
    start = local(CASEY, 2018, 3, 11, 0, 0)
    assert walk("30 2 * * *", start, 2) == ["03-11 02:30+1100", "03-12 02:30+0800"]
    assert walk("30 */1 * * *", start, 6) == [  # wildcard: both passes
        "03-11 00:30+1100",
        "03-11 01:30+1100",
        "03-11 02:30+1100",
        "03-11 03:30+1100",
        "03-11 01:30+0800",
        "03-11 02:30+0800",
    ]
    # A 3-hour gap is not (a jump of 181 minutes): no catch-up, the skipped time is just lost.
    start = local(CASEY, 2018, 10, 7, 0, 0)
    assert walk("30 5 * * *", start, 2) == ["10-08 05:30+1100", "10-09 05:30+1100"]
    assert not parse("30 5 * * *").matches(local(CASEY, 2018, 10, 7, 7, 0))


# -- matches and next describe the same instants, minute by minute, around every transition ---

TRANSITIONS = [
    (BERLIN, datetime(2026, 3, 29, 0, 0, tzinfo=UTC)),
    (BERLIN, datetime(2026, 10, 24, 23, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2026, 3, 8, 5, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2026, 11, 1, 4, 0, tzinfo=UTC)),
    (LORD_HOWE, datetime(2026, 10, 3, 14, 0, tzinfo=UTC)),
    (LORD_HOWE, datetime(2026, 4, 4, 13, 0, tzinfo=UTC)),
    (SAO_PAULO, datetime(2018, 11, 4, 0, 0, tzinfo=UTC)),
    (SAO_PAULO, datetime(2019, 2, 16, 23, 0, tzinfo=UTC)),
    (APIA, datetime(2011, 12, 30, 7, 0, tzinfo=UTC)),
    (CASEY, datetime(2018, 3, 10, 14, 0, tzinfo=UTC)),
    (CASEY, datetime(2018, 10, 6, 17, 0, tzinfo=UTC)),
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
    "30 23 * * *",
    "*/30 23,0 * * *",
    "0 0 * * *",
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
