"""The uptime report read from Redis against a replay of the results that made its history.

Generated results of a check's regions go through the production post-exec write
(``support.health.run_once``: a leased job finished by ``complete.lua``, which moves the region,
counts the quorum, makes the transitions into the capped stream and records the first result);
the report is then read back as ``checks report`` reads it (``uptime_reports``). Independently,
the same results are replayed minute by minute with the pure state rules (``region_step``,
``overall_state``), the stream's cap applied to the transitions the replay sees, and each minute
of the range classified and walked (``support.uptime_replay``). Results fall on whole minutes,
so the report and the replay agree exactly, for the range and for each UTC day of it.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from support.health import run_once
from support.uptime_replay import MIN, assert_same, brute_totals

from celery_app.checks.uptime import uptime_reports
from celery_app.redis.schema import CheckStateField
from scheduling_core.health import RegionHealth, State, overall_state, region_step
from scheduling_core.uptime import Bucket, bucket_spans

BASE = int(datetime(2024, 3, 30, 20, tzinfo=UTC).timestamp()) // MIN  # in minutes
_uids = itertools.count()
#: down first: hypothesis leans to the first choice, and a check that never leaves up tests little
STATES = [State.DOWN, State.DEGRADED, State.UP]


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_report_from_redis_matches_a_replay_of_the_results(r, keys, store, data):
    regions = data.draw(st.sampled_from([["eu"], ["eu", "us"], ["ap", "eu", "us"]]))
    failure, success = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    quorum = data.draw(st.integers(1, len(regions)))
    cap = data.draw(st.integers(1, 4), label="CHECKBEAT_TRANSITIONS_HISTORY")
    rounds = data.draw(
        st.lists(
            st.tuples(
                st.integers(1, 180),  # minutes since the previous round
                st.lists(st.sampled_from(STATES), min_size=3, max_size=3),
            ),
            min_size=3,
            max_size=30,
        ),
        label="rounds: every region runs once",
    )
    uid = f"rep{next(_uids)}"
    store.create(
        uid=uid, tenant="acme", kind="testprobe", target="x", period=60, regions=regions,
        failure_threshold=failure, success_threshold=success, quorum=quorum,
    )  # fmt: skip
    limited = store.settings.model_copy(update={"transitions_history": cap})

    # the production path
    minute = BASE
    times = []
    for gap, states in rounds:
        minute += gap
        times.append(minute)
        for region, state in zip(regions, states, strict=False):
            ok, degraded = state != State.DOWN, ("latency" if state == State.DEGRADED else None)
            run_once(r, keys, limited, store.params, f"{uid}@{region}", ok, minute * MIN,
                     degraded=degraded)  # fmt: skip
    now = minute + data.draw(st.integers(1, 600), label="minutes after the last round")

    # the replay: the announced state of every minute, and the transitions it made
    health = {region: RegionHealth() for region in regions}
    announced, transitions, state_at = State.UP, [], {}
    for m, (_gap, states) in zip(times, rounds, strict=True):
        for region, state in zip(regions, states, strict=False):
            # each run counts the quorum: a round may make transitions at one instant
            health[region] = region_step(health[region], state, failure, success)
            observed = overall_state([health[g].state for g in regions], quorum)
            if observed != announced:
                transitions.append(m)
                announced = observed
        state_at[m] = announced
    kept = transitions[-cap:]
    # the store made the same transitions, and kept the same ones
    assert int(r.hget(keys.check_state(uid), CheckStateField.SEQ) or 0) == len(transitions)
    assert r.xlen(keys.check_transitions(uid)) == len(kept)
    known_from = times[0] if kept == transitions else kept[0]

    def announced_at(m):
        if m < known_from or m >= now:
            return None
        return state_at[max(t for t in times if t <= m)]

    start = data.draw(st.integers(BASE, now), label="from")
    end = data.draw(st.integers(start + 1, now + 600), label="to")
    minutes = {m: (announced_at(m), False) for m in range(start, end + 1)}

    note(f"{len(transitions)} transitions, {len(kept)} kept, {len(times)} rounds")
    event("stream trimmed" if kept != transitions else "whole history kept")
    event("no transition" if not transitions else "transitions made")
    (report,) = uptime_reports(r, keys, [uid], start * MIN, end * MIN, by=Bucket.DAY, now=now * MIN)
    assert report.history_start == known_from * MIN
    assert_same(report.total.totals, brute_totals(minutes, start, end))
    days = bucket_spans(start * MIN, end * MIN, Bucket.DAY, UTC)
    assert [(p.totals.start, p.totals.end) for p in report.buckets] == days
    for period, (s, e) in zip(report.buckets, days, strict=True):
        assert_same(period.totals, brute_totals(minutes, int(s) // MIN, int(e) // MIN))
