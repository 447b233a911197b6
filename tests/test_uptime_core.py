"""The uptime accounting (scheduling_core.uptime) against a minute-by-minute replay.

A check is simulated from generated per-region results through the production state rules
(``health.region_step``, ``overall_state``) with maintenance windows holding changes back (as
``complete.lua`` and ``transition_release.lua`` do), giving the transitions the store would
keep (its stream capped at a generated length) and, independently, the announced state of
every minute. The replay then classifies every minute of the report's range on its own
(no-data, a window by ``health.window_end``, the state), cuts buckets by each minute's local
date, and finds incidents by walking the minutes. Every event falls on a whole minute, so the
report and the replay must agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.uptime_replay import MIN, assert_same, brute_totals

from scheduling_core import parse
from scheduling_core.health import RegionHealth, State, overall_state, region_step, window_end
from scheduling_core.uptime import (
    Bucket,
    History,
    Step,
    account,
    bucket_spans,
    merge_spans,
    segments,
    window_spans,
)

BASE = int(datetime(2024, 1, 24, tzinfo=UTC).timestamp())  # a week before a month's end
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe"]
CRONS = ["0 3 * * *", "30 1 * * sun", "0 */6 * * *", "15 12 1 * *", "0 0 * * *", "*/45 * * * *"]


@dataclass
class Simulated:
    steps: list[Step]
    announced: dict[int, State]  # minute -> the announced state over it
    first: int
    now: int
    windows: list[tuple[str, int, str]]


def simulate(data, regions: list[str], windows) -> Simulated:
    failure = data.draw(st.integers(1, 3), label="failure")
    success = data.draw(st.integers(1, 3), label="success")
    quorum = data.draw(st.integers(1, len(regions)), label="quorum")
    period = data.draw(st.integers(1, 30), label="period (minutes)")
    first = BASE // MIN + data.draw(st.integers(0, 8 * 24 * 60), label="first result")
    length = data.draw(st.integers(1, 9 * 24 * 60), label="minutes simulated")
    runs = {
        r: data.draw(
            st.lists(
                st.tuples(st.sampled_from(list(State)), st.integers(1, 40)), min_size=1, max_size=8
            ),
            label=f"results of {r}",
        )
        for r in regions
    }
    schedules = [(parse(c), timedelta(minutes=d), ZoneInfo(z)) for c, d, z in windows]

    def results_of(r):
        while True:
            for state, count in runs[r]:
                yield from [state] * count

    streams = {r: results_of(r) for r in regions}
    health = {r: RegionHealth() for r in regions}
    announced = State.UP
    steps: list[Step] = []
    states: dict[int, State] = {}
    for m in range(first, first + length):
        if (m - first) % period == 0:
            for r in regions:
                health[r] = region_step(health[r], next(streams[r]), failure, success)
        observed = overall_state([health[r].state for r in regions], quorum)
        when = datetime.fromtimestamp(m * MIN, UTC)
        in_window = any(window_end(s, d, z, when) for s, d, z in schedules)
        if observed != announced and not in_window:  # inside a window the change is held
            steps.append(Step(m * MIN, announced, observed, {r: health[r].state for r in regions}))
            announced = observed
        states[m] = announced
    return Simulated(steps, states, first, first + length, windows)


def replay(sim: Simulated, kept: list[Step], complete: bool, known_from: int, region, start, end):
    """Per minute of [start, end]: its category and its state (None: no data)."""
    schedules = [(parse(c), timedelta(minutes=d), ZoneInfo(z)) for c, d, z in sim.windows]

    def state_at(m):
        if m < known_from or m >= sim.now:
            return None
        if region is None:
            return sim.announced[m]
        recorded = [s for s in kept if s.at <= m * MIN]
        if not recorded:
            return State.UP if complete else None
        return recorded[-1].regions.get(region)

    def in_window(m):
        when = datetime.fromtimestamp(m * MIN, UTC)
        return any(window_end(s, d, z, when) for s, d, z in schedules)

    return {m: (state_at(m), in_window(m)) for m in range(start, end + 1)}


windows_strategy = st.lists(
    st.tuples(st.sampled_from(CRONS), st.integers(1, 240), st.sampled_from(ZONES)), max_size=2
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    regions=st.sampled_from([["eu"], ["eu", "us"], ["ap", "eu", "us"]]),
    windows=windows_strategy,
    by=st.sampled_from(list(Bucket)),
    zone=st.sampled_from(ZONES),
)
def test_report_matches_a_minute_by_minute_replay(data, regions, windows, by, zone):
    sim = simulate(data, regions, windows)
    maxlen = data.draw(st.integers(1, 40), label="stream MAXLEN")
    kept = sim.steps[-maxlen:]
    complete = len(kept) == len(sim.steps)
    known_from = sim.first if complete else kept[0].at // MIN
    history = History(tuple(kept), known_from * MIN, sim.now * MIN, complete)
    region = data.draw(st.sampled_from([None, *regions]), label="region")
    start = data.draw(
        st.one_of(st.integers(sim.first, sim.now), st.integers(sim.first - 2 * 24 * 60, sim.now)),
        label="from",
    )
    end = data.draw(st.integers(start + 1, min(start + 12 * 24 * 60, sim.now + 2 * 24 * 60)))

    segs = segments(history, region)
    spans = merge_spans(
        span
        for c, d, z in windows
        for span in window_spans(
            parse(c), timedelta(minutes=d), ZoneInfo(z), start * MIN, end * MIN
        )
    )
    minutes = replay(sim, kept, complete, known_from, region, start, end)
    whole = account(segs, spans, start * MIN, end * MIN)
    assert_same(whole, brute_totals(minutes, start, end))
    assert whole.up + whole.degraded + whole.down + whole.maintenance + whole.no_data == (
        (end - start) * MIN
    )

    # buckets: cut the replay by each minute's local date
    tz = ZoneInfo(zone)

    def key(m):
        local = datetime.fromtimestamp(m * MIN, tz).date()
        if by == Bucket.WEEK:
            return local - timedelta(days=local.weekday())
        if by == Bucket.MONTH:
            return local.replace(day=1)
        return local

    cuts: list[tuple[int, int]] = []
    for m in range(start, end):
        if cuts and key(m) == key(cuts[-1][0]):
            cuts[-1] = (cuts[-1][0], m + 1)
        else:
            cuts.append((m, m + 1))
    buckets = bucket_spans(start * MIN, end * MIN, by, tz)
    assert buckets == [(s * MIN, e * MIN) for s, e in cuts]
    for s, e in cuts:
        bucket_spans_ = merge_spans(
            span
            for c, d, z in windows
            for span in window_spans(parse(c), timedelta(minutes=d), ZoneInfo(z), s * MIN, e * MIN)
        )
        assert_same(account(segs, bucket_spans_, s * MIN, e * MIN), brute_totals(minutes, s, e))


def test_a_down_period_across_a_window_is_one_incident_without_the_window():
    history = History(
        (Step(1000, State.UP, State.DOWN), Step(5000, State.DOWN, State.UP)), 0, 10_000, True
    )
    totals = account(segments(history), [(2000, 3000)], 0, 10_000)
    assert (totals.incidents, totals.longest_incident, totals.down) == (1, 3000, 3000)
    assert (totals.maintenance, totals.up, totals.mttr, totals.uptime_pct) == (
        1000,
        6000,
        3000,
        66.66666666666667,
    )


def test_nothing_known_is_neither_up_nor_down():
    history = History((), None, 10_000, True)
    totals = account(segments(history), [], 0, 10_000)
    assert totals.no_data == 10_000 and totals.uptime_pct is None and totals.mttr is None
