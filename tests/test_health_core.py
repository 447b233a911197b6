"""The pure state rules (scheduling_core.health): region steps, the quorum, maintenance windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from scheduling_core import parse
from scheduling_core.health import (
    MAX_THRESHOLD,
    RegionHealth,
    State,
    classify,
    default_quorum,
    effective_quorum,
    next_window_start,
    overall_state,
    region_step,
    window_end,
)

RANK = {State.UP: 0, State.DEGRADED: 1, State.DOWN: 2}
results = st.lists(st.sampled_from(list(State)), max_size=60)
thresholds = st.integers(min_value=1, max_value=6)


FRESH = RegionHealth()


def run(seq, failure, success, start=FRESH):
    health = start
    history = []
    for result in seq:
        health = region_step(health, result, failure, success)
        history.append(health)
    return history


def test_classify():
    assert classify(False) == State.DOWN
    assert classify(False, "slow") == State.DOWN  # a failure is a failure
    assert classify(True) == State.UP
    assert classify(True, "certificate expires in 3 days") == State.DEGRADED
    assert classify(True, "") == State.UP


def test_down_after_exactly_failure_threshold_failures_and_up_after_success_threshold():
    history = run([State.DOWN] * 3 + [State.UP] * 2, failure=3, success=2)
    assert [h.state for h in history] == [
        State.UP,
        State.UP,
        State.DOWN,
        State.DOWN,
        State.UP,
    ]


def test_an_interrupted_streak_starts_again():
    history = run([State.DOWN, State.DOWN, State.UP, State.DOWN, State.DOWN], 3, 1)
    assert all(h.state == State.UP for h in history)


def test_degraded_is_worse_than_up_and_better_than_down():
    # up -> degraded needs failure_threshold degraded results; down -> degraded success_threshold
    history = run([State.DEGRADED] * 2, failure=2, success=5)
    assert history[-1].state == State.DEGRADED
    down = RegionHealth(State.DOWN, State.DOWN, 3)
    history = run([State.DEGRADED] * 2, failure=5, success=2, start=down)
    assert [h.state for h in history] == [State.DOWN, State.DEGRADED]


@given(results, thresholds, thresholds)
def test_a_state_is_only_entered_after_its_threshold_of_identical_results(seq, failure, success):
    history = run(seq, failure, success)
    previous = State.UP
    for i, health in enumerate(history):
        if health.state != previous:
            needed = failure if RANK[health.state] > RANK[previous] else success
            tail = seq[max(0, i - needed + 1) : i + 1]
            assert len(tail) == needed and set(tail) == {health.state}
        previous = health.state
        assert 1 <= health.streak <= MAX_THRESHOLD
        assert health.streak_state == seq[i]


@given(results, thresholds, thresholds)
def test_threshold_one_follows_every_result(seq, failure, success):
    history = run(seq, 1, 1)
    assert [h.state for h in history] == seq


@given(st.lists(st.sampled_from(list(State)), min_size=1, max_size=9), st.data())
def test_overall_state_follows_the_quorum(states, data):
    quorum = data.draw(st.integers(min_value=1, max_value=len(states)))
    overall = overall_state(states, quorum)
    down = states.count(State.DOWN)
    bad = down + states.count(State.DEGRADED)
    assert (overall == State.DOWN) == (down >= quorum)
    assert (overall == State.UP) == (bad < quorum)
    # monotone: one more region down never makes the check better
    worse = [State.DOWN, *states[1:]]
    assert RANK[overall_state(worse, quorum)] >= RANK[overall]


def test_default_quorum_is_a_majority():
    assert [default_quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert effective_quorum(None, 3) == 2
    assert effective_quorum(5, 3) == 3  # at most the regions the check has
    assert effective_quorum(1, 3) == 1
    assert overall_state([State.DOWN, State.UP, State.UP], 2) == State.UP
    assert overall_state([State.DOWN, State.DOWN, State.UP], 2) == State.DOWN
    assert overall_state([State.DOWN, State.DEGRADED, State.UP], 2) == State.DEGRADED


# --- maintenance windows ---------------------------------------------------------------------

SUNDAY_3AM = parse("0 3 * * sun")
BERLIN = ZoneInfo("Europe/Berlin")


def test_inside_and_outside_a_weekly_window():
    start = datetime(2026, 3, 1, 3, 0, tzinfo=BERLIN)  # a Sunday
    hour = timedelta(hours=1)
    assert (
        window_end(SUNDAY_3AM, hour, BERLIN, start.astimezone(UTC)) == start.astimezone(UTC) + hour
    )
    inside = start + timedelta(minutes=59, seconds=59)
    assert window_end(SUNDAY_3AM, hour, BERLIN, inside) is not None
    assert window_end(SUNDAY_3AM, hour, BERLIN, start + hour) is None  # the end is outside
    assert window_end(SUNDAY_3AM, hour, BERLIN, start - timedelta(seconds=1)) is None
    assert next_window_start(SUNDAY_3AM, BERLIN, start) == start + timedelta(days=7)


def test_a_window_lasts_its_real_duration_across_a_dst_change():
    # 2026-03-29 02:00 Berlin springs forward: a window from 01:30 for 2 h ends 04:30 local
    spec = parse("30 1 29 3 *")
    start = datetime(2026, 3, 29, 1, 30, tzinfo=BERLIN)
    end = window_end(spec, timedelta(hours=2), BERLIN, start + timedelta(minutes=1))
    assert end is not None
    assert end - start.astimezone(UTC) == timedelta(hours=2)


def test_overlapping_windows_merge():
    every_minute = parse("* * * * *")
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    end = window_end(every_minute, timedelta(minutes=5), UTC, now)
    assert end == datetime(2026, 1, 1, 12, 5, tzinfo=UTC)  # the 12:00 window, latest start


@given(
    st.integers(min_value=0, max_value=7 * 24 * 60),
    st.integers(min_value=1, max_value=600),
)
def test_window_end_agrees_with_walking_the_starts(offset_min, duration_min):
    spec = parse("15 */6 * * *")
    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    now = t0 + timedelta(minutes=offset_min, seconds=17)
    duration = timedelta(minutes=duration_min)
    starts, s = [], spec.next(now - timedelta(days=2))
    while s <= now:
        starts.append(s)
        s = spec.next_after(s)
    open_ends = [x + duration for x in starts if x <= now < x + duration]
    expected = max(open_ends) if open_ends else None
    assert window_end(spec, duration, UTC, now) == expected
