"""Differential property tests against cronsim, and matches/next agreement by brute force.

cronsim (https://github.com/cuu508/cronsim) follows the same day rule as cronie (a day field is
restricted unless it starts with '*'; two restricted fields are OR'ed) and iterates strictly after
its start. Known, documented divergences, kept out of the generated specs or checked explicitly:

1. Day-of-week ranges that end at 0/SUN (``5-0``, ``FRI-SUN``): cronie reads them as ``5-7``;
   cronsim rejects them. Not generated here (covered by the vector table).
2. Specs that can never fire under AND (``0 0 30 2 *``): we parse them and ``next`` is ``None``;
   cronsim raises CronSimError at parse. Checked explicitly: cronsim refuses exactly ours-never.
3. cronsim gives up (StopIteration) when nothing matches within 50 years; we answer exactly.
   Checked explicitly: then our answer is more than 50 years away.
4. Syntax cronsim accepts and we refuse (Quartz ``L``, ``W``, ``#``, six fields with seconds) and
   macros (we accept ``@daily`` etc.; cronsim does not): not generated here (see the error and
   vector tests).
5. Time zones: the main comparison is in UTC; a second one runs around the 2026 transitions of
   Europe/Berlin and America/New_York, where cronsim follows the same cronie DST rules. There,
   a fixed-time spec asked from the repeated pass of an overlap (fold=1) is left out: cronsim
   drops the fold and answers with the first pass, an instant *before* its start
   (test_cronsim_answers_before_its_start_in_the_repeated_pass pins this). DST behaviour itself
   is pinned by tests/test_cron_dst.py.
6. (None since cronsim 2.9, which reads a one-value range with a step, ``5-5/10``, as cronie
   does: just 5. Generated here, and pinned by test_single_value_range_with_step below.)
7. Clock changes of three hours or more (Antarctica/Casey's 3-hour gaps, Samoa's skipped day):
   cronsim catches up skipped fixed-time jobs after any gap; cronie, and we, only after gaps
   shorter than three hours (test_cronsim_catches_up_after_a_three_hour_gap pins this).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import cronsim
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from scheduling_core.cron import parse

MINUTE = timedelta(minutes=1)
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


@st.composite
def value(draw: st.DrawFn, index: int, lo: int, hi: int) -> tuple[int, str]:
    n = draw(st.integers(lo, hi))
    text = str(n)
    if index == 3 and draw(st.booleans()):
        text = draw(st.sampled_from([MONTHS[n - 1], MONTHS[n - 1].lower()]))
    elif index == 4 and n < 7 and draw(st.booleans()):
        text = draw(st.sampled_from([DAYS[n], DAYS[n].capitalize()]))
    elif draw(st.integers(0, 9)) == 0:
        text = "0" + text  # a leading zero is still a number
    return n, text


@st.composite
def element(draw: st.DrawFn, index: int) -> str:
    lo, hi = BOUNDS[index]
    span = hi - lo + 1
    kind = draw(st.sampled_from(["*", "*/S", "N", "A-B", "A-B/S", "N/S"]))
    step = draw(st.integers(1, span + 2))
    if kind == "*":
        return "*"
    if kind == "*/S":
        return f"*/{step}"
    n, text = draw(value(index, lo, hi))
    if kind == "N":
        return text
    if kind == "N/S":
        return f"{text}/{step}"
    if kind == "A-B/S":
        # start <= end: cronsim rejects 5-0 (divergence 1)
        _, end = draw(value(index, n, hi))
        return f"{text}-{end}/{step}"
    _, end = draw(value(index, n, hi))
    return f"{text}-{end}"


@st.composite
def field(draw: st.DrawFn, index: int) -> str:
    if index in (2, 4) and draw(st.integers(0, 2)) == 0:
        return "*"  # keep both day-rule modes frequent
    return ",".join(draw(st.lists(element(index), min_size=1, max_size=3)))


specs = st.tuples(*(field(i) for i in range(5))).map(" ".join)
starts = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2090, 12, 31), timezones=st.just(UTC)
)


def cronsim_next(spec: str, start: datetime) -> datetime | str | None:
    """cronsim's first firing strictly after ``start``; "refused" or "gave up" otherwise."""
    try:
        iterator = cronsim.CronSim(spec, start)
    except cronsim.CronSimError:
        return "refused"
    try:
        return next(iterator)
    except StopIteration:
        return "gave up"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, start=starts, whole_minute=st.booleans())
def test_next_agrees_with_cronsim(spec: str, start: datetime, whole_minute: bool) -> None:
    if whole_minute:
        start = start.replace(second=0, microsecond=0)
    schedule = parse(spec)
    # cronsim answers strictly after start; ours is the earliest minute start >= t.
    on_the_minute = start.second == 0 and start.microsecond == 0
    ours = schedule.next(start + MINUTE if on_the_minute else start)
    theirs = cronsim_next(spec, start)
    event(f"cronsim {theirs}" if isinstance(theirs, str) else "compared")
    if theirs == "refused":  # divergence 2
        assert schedule.never and ours is None
    elif theirs == "gave up":  # divergence 3
        assert ours is None or ours.year > start.year + 50
    else:
        assert ours == theirs


# Sparse specs: late days of a few months, under AND (with '*' or a '*/S' weekday field) and OR.
# These reach the never-matching specs (divergence 2), leap days and far-away answers.
sparse_specs = st.tuples(
    st.sampled_from(["0", "59"]),
    st.sampled_from(["0", "23"]),
    st.lists(st.integers(28, 31), min_size=1, max_size=2).map(lambda v: ",".join(map(str, v))),
    st.lists(st.integers(1, 12), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v))),
    st.sampled_from(["*", "*/2", "*/3", "*/7", "1", "5-6"]),
).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(spec=sparse_specs, start=starts)
def test_sparse_specs_agree_with_cronsim(spec: str, start: datetime) -> None:
    start = start.replace(second=0, microsecond=0)
    ours = parse(spec).next(start + MINUTE)
    theirs = cronsim_next(spec, start)
    event(f"cronsim {theirs}" if isinstance(theirs, str) else "compared")
    if theirs == "refused":  # divergence 2
        assert parse(spec).never and ours is None
    elif theirs == "gave up":  # divergence 3
        assert ours is None or ours.year > start.year + 50
    else:
        assert ours == theirs


TRANSITIONS = [
    (ZoneInfo("Europe/Berlin"), datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    (ZoneInfo("Europe/Berlin"), datetime(2026, 10, 25, 1, 0, tzinfo=UTC)),
    (ZoneInfo("America/New_York"), datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),
    (ZoneInfo("America/New_York"), datetime(2026, 11, 1, 6, 0, tzinfo=UTC)),
]
night_hours = st.sampled_from(["1", "2", "3", "1-3", "0-4/2", "2,3", "*/2", "*", "1/3"])
dst_specs = st.tuples(field(0), field(1) | night_hours, field(2), st.just("*"), field(4)).map(
    " ".join
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=dst_specs,
    transition=st.sampled_from(TRANSITIONS),
    minutes=st.integers(-300, 300),
)
def test_next_agrees_with_cronsim_around_dst_transitions(
    spec: str, transition: tuple[ZoneInfo, datetime], minutes: int
) -> None:
    tz, moment = transition
    start = (moment + timedelta(minutes=minutes)).astimezone(tz)
    schedule = parse(spec)
    assume(not (start.fold and schedule.fixed_time))  # divergence 5
    ours = schedule.next((start.astimezone(UTC) + MINUTE).astimezone(tz))
    theirs = cronsim_next(spec, start)
    assert isinstance(theirs, datetime)
    assert ours is not None
    assert ours.astimezone(UTC) == theirs.astimezone(UTC)
    assert ours.utcoffset() == theirs.utcoffset()


def test_cronsim_answers_before_its_start_in_the_repeated_pass() -> None:
    """Divergence 5, pinned: from 01:03 EST (the repeated hour), ``30 1 * * *`` next fires the
    following day; cronsim answers 01:30 EDT, half an hour before its own start."""
    new_york = ZoneInfo("America/New_York")
    start = datetime(2026, 11, 1, 1, 3, tzinfo=new_york, fold=1)
    theirs = cronsim_next("30 1 * * *", start)
    assert isinstance(theirs, datetime)
    assert theirs.astimezone(UTC) < start.astimezone(UTC)
    ours = parse("30 1 * * *").next_after(start)
    assert ours == datetime(2026, 11, 2, 1, 30, tzinfo=new_york)


def test_cronsim_catches_up_after_a_three_hour_gap() -> None:
    """Divergence 7, pinned: Casey jumped from 04:00 +08 to 07:00 +11 on 2018-10-07."""
    casey = ZoneInfo("Antarctica/Casey")
    start = datetime(2018, 10, 7, 0, 0, tzinfo=casey)
    assert cronsim_next("30 5 * * *", start) == datetime(2018, 10, 7, 7, 0, tzinfo=casey)
    assert parse("30 5 * * *").next_after(start) == datetime(2018, 10, 8, 5, 30, tzinfo=casey)


def test_differential_catches_an_and_or_mixup() -> None:
    """The comparison above is not vacuous: the day rule is where libraries differ most."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse("0 0 13 * 5").next(start + MINUTE) == cronsim_next("0 0 13 * 5", start)
    assert parse("0 0 */2 * 1").next(start + MINUTE) == cronsim_next("0 0 */2 * 1", start)
    assert cronsim_next("0 0 30 2 *", start) == "refused"
    assert parse("0 0 30 2 *").next(start) is None


def test_single_value_range_with_step() -> None:
    """A-A/S is just A, as cronie's loop ``for i = A; i <= A; i += S``; cronsim 2.9 agrees."""
    start = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    assert parse("5-5/10 * * * *").next(start + MINUTE) == datetime(2026, 1, 1, 1, 5, tzinfo=UTC)
    assert cronsim_next("5-5/10 * * * *", start) == datetime(2026, 1, 1, 1, 5, tzinfo=UTC)


# -- matches and next agree -------------------------------------------------------------------

zones = st.sampled_from(
    [UTC, ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York"), ZoneInfo("Australia/Lord_Howe")]
)
# specs dense enough that the next firing is usually within a few days
dense_specs = st.tuples(
    field(0), field(1), st.just("*") | field(2), st.just("*"), st.just("*") | field(4)
).map(" ".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=dense_specs,
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2060, 1, 1)),
    tz=zones,
)
def test_next_is_the_first_matching_minute(spec: str, start: datetime, tz: object) -> None:
    """next(t) matches, and no minute in [t, next(t)) matches -- checked minute by minute."""
    schedule = parse(spec)
    t = start.replace(tzinfo=UTC).astimezone(tz)
    fired = schedule.next(t)
    assert fired is not None
    assert fired.tzinfo is t.tzinfo
    assert (fired.second, fired.microsecond) == (0, 0)
    assert fired.astimezone(UTC) >= t.astimezone(UTC)  # same-zone comparisons ignore fold
    assert schedule.matches(fired)
    u = t.astimezone(UTC)
    if u.second or u.microsecond:
        u = u.replace(second=0, microsecond=0) + MINUTE
    end = fired.astimezone(UTC)
    limit = u + timedelta(days=3)
    while u < min(end, limit):
        assert not schedule.matches(u.astimezone(t.tzinfo)), u
        u += MINUTE


@settings(max_examples=150, deadline=None)
@given(spec=specs, start=starts)
def test_match_at_next_and_none_exactly_when_never(spec: str, start: datetime) -> None:
    schedule = parse(spec)
    fired = schedule.next(start)
    if fired is None:
        assert schedule.never
    else:
        assert schedule.matches(fired)
        assert schedule.next(fired) == fired  # a matching whole minute is its own next
