"""The closed loop through the real dispatcher and real workers: lanes learned from cost with
hysteresis, time limits from cost, delay as telemetry only, and a capped results history.

Lower thresholds than the defaults keep it quick: slow >= 300 ms, fast < 150 ms.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from support.partitions import suite_keys
from support.polling import wait_for

from celery_app.checks.jobs import read_job
from celery_app.checks.store import CheckStore
from celery_app.redis.schema import check_queue, job_id
from scheduling_core import LANE_FAST, LANE_SLOW, Params, classify_lane, update_ewma

KEYS = suite_keys("cbtest")
FAST_Q, SLOW_Q = check_queue("local", "fast"), check_queue("local", "slow")
#: One reserved fast slot and two shared ones in each partition of the check half (the slots
#: of a worker are shared out among the partitions).
LANES = {
    "lane_slow_threshold_ms": 300.0,
    "lane_fast_threshold_ms": 150.0,
    "pool_size": 3 * KEYS.partitions,
    "fast_lane_reserved": KEYS.partitions,
}


def env_of(settings: dict) -> dict[str, str]:
    return {f"CHECKBEAT_{k.upper()}": str(v) for k, v in settings.items()}


def history(r, uid: str) -> list[dict]:
    return [json.loads(f["result"]) for _id, f in r.xrange(KEYS.results(uid))]


def job(r, uid: str):
    return read_job(r, KEYS, job_id(uid, "local"))


@pytest.mark.timeout(60)
def test_lanes_are_learned_with_hysteresis_and_slow_work_stays_off_reserved_slots(
    r, make_app, start_worker_process, dispatching, target, allow_private
):
    settings = {**LANES, "allow_private_targets": True}
    app = make_app(**settings)
    fast = start_worker_process(
        "--role", "fast", "-P", "threads", "-n", "fast@lanes", **env_of(settings)
    )
    shared = start_worker_process(
        "--role", "shared", "-P", "threads", "-n", "shared@lanes", **env_of(settings)
    )
    wait_for(lambda: r.scard(KEYS.region_workers("local")) == 2, 30, what="both roles registered")
    wait_for(lambda: "ready" in fast.output() and "ready" in shared.output(), 30, what="ready")

    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    target.set_delay("quick", 20)
    target.set_delay("shifty", 20)
    for uid in ("quick", "shifty"):
        store.create(uid=uid, tenant="t", kind="http", target=target.url(f"/named/{uid}"), period=1)
    dispatching(app, interval=0.05)

    wait_for(lambda: len(history(r, "shifty")) >= 3, 20, what="the first run and two fast ones")
    target.set_delay("shifty", 500)
    wait_for(lambda: job(r, "shifty").lane == LANE_SLOW, 20, what="shifty to move to the slow lane")
    target.set_delay("shifty", 20)
    wait_for(lambda: job(r, "shifty").lane == LANE_FAST, 20, what="shifty to come back")
    wait_for(lambda: history(r, "shifty")[-1]["queue"] == FAST_Q, 10, what="a fast-lane run again")

    runs = history(r, "shifty")
    # its first run had no measured cost: it ran in a shared slot, not a reserved fast one
    assert runs[0]["queue"] == SLOW_Q
    queues = [run["queue"] for run in runs]
    # (first) fast ... slow ... fast: the lane moved both ways, learned from the runs alone
    first_slow = queues.index(SLOW_Q, 1)
    assert FAST_Q in queues[first_slow:]
    # Replaying the cost EWMA over the measured durations predicts the queue of every next run;
    # the band between the thresholds held the previous lane (hysteresis).
    params = Params.from_settings(app.conf.checkbeat_settings)
    cost, lane, held_in_band = 0.0, LANE_FAST, 0
    for previous, nxt in pairwise(runs):
        cost = update_ewma(cost, previous["duration_ms"])
        new_lane = classify_lane(lane, cost, params)
        if 150 <= cost < 300:
            held_in_band += 1
            assert new_lane == lane
        lane = new_lane
        assert nxt["queue"] == check_queue("local", lane), (previous, nxt, cost)
    assert held_in_band >= 2
    slow_samples_before_move = sum(1 for run in runs[:first_slow] if run["duration_ms"] >= 300)
    assert slow_samples_before_move >= 2  # one slow run does not move a check (EWMA + band)
    # Slow work ran only on the shared worker; the fast one's reserved slot never took any.
    assert {run["worker"] for run in runs if run["queue"] == SLOW_Q} == {"shared@lanes"}
    # The 20 ms check never left the fast lane once its cost was measured.
    quick = [run["queue"] for run in history(r, "quick")]
    assert quick[0] == SLOW_Q and set(quick[1:]) == {FAST_Q}
    assert job(r, "quick").lane == LANE_FAST


@pytest.mark.timeout(60)
def test_soft_limit_is_a_timeout_pinning_cost_and_cost_aware_timeouts_shrink(
    r, make_app, run_worker, dispatching, target, allow_private
):
    app = make_app(
        allow_private_targets=True,
        check_timeout=1.0,
        cost_timeout_factor=4.0,
        cost_timeout_floor=0.25,
        results_history=5,
    )
    run_worker(app, [FAST_Q, SLOW_Q], concurrency=3)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="stuck", tenant="t", kind="http", target=target.url("/delay/3000"), period=1)
    store.create(uid="brisk", tenant="t", kind="http", target=target.url("/delay/10"), period=1)
    store.create(uid="broken", tenant="t", kind="http", target=target.url("/status/500"), period=1)
    dispatching(app, interval=0.05)

    wait_for(lambda: history(r, "stuck"), 15, what="the stuck check's first run")
    (first,) = history(r, "stuck")[:1]
    assert (first["status"], first["error_class"]) == ("timeout", "timeout")
    assert first["timeout_s"] == pytest.approx(1.0)  # no cost yet: the full ceiling
    assert 900 <= first["duration_ms"] < 2500
    assert job(r, "stuck").cost_ewma_ms == pytest.approx(1000.0)  # pinned to the ceiling

    # A consistently fast check is given ever shorter limits: 4 x cost, floored at 0.25 s.
    wait_for(lambda: history(r, "brisk"), 15, what="the brisk check's first run")
    assert history(r, "brisk")[0]["timeout_s"] == pytest.approx(1.0)  # no cost yet: the ceiling
    wait_for(
        lambda: (
            history(r, "brisk")[-1]["timeout_s"] == pytest.approx(0.25)
            if history(r, "brisk")
            else False
        ),
        20,
        what="the brisk check's limit to reach the floor",
    )
    limits = [run["timeout_s"] for run in history(r, "brisk")]
    assert all(a >= b for a, b in pairwise(limits))  # it only shrinks while the check is fast
    assert all(run["status"] == "up" for run in history(r, "brisk"))

    # The history is capped at CHECKBEAT_RESULTS_HISTORY and errors carry their class.
    wait_for(lambda: job(r, "broken").runs >= 7, 20, what="seven runs of the broken check")
    kept = history(r, "broken")
    assert len(kept) == 5
    assert {(run["status"], run["error_class"]) for run in kept} == {("down", "status")}
    assert json.loads(r.hget(KEYS.last_result("broken"), "local"))["error_class"] == "status"


@pytest.mark.timeout(60)
def test_delay_ewma_grows_only_with_late_starts_and_never_steers(
    r, make_app, run_worker, dispatching, target, allow_private
):
    app = make_app(allow_private_targets=True, slow_threshold_ms=1.0, **LANES)
    params = Params.from_settings(app.conf.checkbeat_settings)
    run_worker(app, [FAST_Q, SLOW_Q], concurrency=2)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="d", tenant="t", kind="http", target=target.url("/delay/20"), period=1)
    ticker = dispatching(app, interval=0.05)

    wait_for(lambda: job(r, "d").runs >= 3, 15, what="three on-time runs")
    on_time = job(r, "d")
    assert on_time.delay_ewma_ms < 300  # dispatched within a tick of its schedule

    ticker.pause()  # beat falls behind: the next start is late by ~2.5 s
    runs = on_time.runs
    wait_for(lambda: job(r, "d").scheduled_at < datetime.now(UTC).timestamp() - 2.5, 10)
    ticker.resume()
    wait_for(lambda: job(r, "d").runs > runs, 10, what="the late run")
    late = job(r, "d")
    assert late.delay_ewma_ms > on_time.delay_ewma_ms + 500
    # Delay is telemetry: the effective deadline and the lane follow the cost alone.
    expected = params.effective_scheduled_at(
        datetime.fromtimestamp(late.scheduled_at, UTC), late.cost_ewma_ms, late.plan_weight
    )
    assert late.effective_scheduled_at == pytest.approx(expected.timestamp(), abs=0.002)
    assert late.lane == LANE_FAST
