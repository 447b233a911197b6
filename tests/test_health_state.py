"""Check state through the real post-exec write (complete.lua on the suite's redis-server):
thresholds, quorum, transitions and their streams, the outbox protocol, maintenance windows,
validation at write, and that updates and the repair keep the state."""

from __future__ import annotations

import json
import random
import time

import pytest
from support.checks import at
from support.health import run_once

from celery_app.checks.check_state import read_transitions
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.checks.maintenance import MaintenanceStore, validate_window
from celery_app.checks.repair import repair
from celery_app.checks.transitions import claim, finish_delivery, release_held, start_delivery
from celery_app.errors import CheckFieldError
from celery_app.redis.schema import CheckStateField, DeliveryOutcome, JobField, TransitionStart
from scheduling_core.health import State, overall_state

T0 = 1_790_000_000.0


def make(store, uid="c", regions=("eu",), **extra):
    return store.create(
        now=at(T0 - 100),
        uid=uid,
        tenant="acme",
        kind="testprobe",
        target="x",
        period=60,
        regions=list(regions),
        **extra,
    )


def state_of(r, keys, uid):
    return r.hgetall(keys.check_state(uid))


def test_down_only_after_failure_threshold_and_up_after_success_threshold(r, keys, store):
    keys = keys.of_check("c")  # its outbox, claims and indexes are its partition's
    make(store, failure_threshold=3, success_threshold=2)
    go = lambda ok, i: run_once(r, keys, store.settings, store.params, "c@eu", ok, T0 + i)  # noqa: E731
    assert go(False, 1) == (True, None)
    assert go(False, 2) == (True, None)
    assert read_job(r, keys, "c@eu").health.state == State.UP
    _written, down = go(False, 3)
    assert down == "c#1"
    assert read_job(r, keys, "c@eu").health.state == State.DOWN
    assert go(True, 4) == (True, None)
    assert go(False, 5) == (True, None)  # the success streak is broken
    assert go(True, 6) == (True, None)
    assert go(True, 7)[1] == "c#2"
    state = state_of(r, keys, "c")
    assert state[CheckStateField.STATE] == "up" and state[CheckStateField.SEQ] == "2"
    # both transitions in the check's and the tenant's streams, newest first, with the results
    check_stream = read_transitions(r, keys.check_transitions("c"))
    assert [(t["from"], t["to"]) for t in check_stream] == [("down", "up"), ("up", "down")]
    assert read_transitions(r, keys.tenant_transitions("acme")) == check_stream
    down_record = check_stream[1]
    assert down_record["id"] == "c#1" and down_record["tenant"] == "acme"
    assert down_record["regions"]["eu"]["state"] == "down"
    assert down_record["regions"]["eu"]["result"]["status"] == "down"
    assert down_record["held"] is False
    # both wait in the outbox for their one delivery
    assert r.zrange(keys.transition_outbox(), 0, -1) == ["c#1", "c#2"]
    assert json.loads(r.hget(keys.transition_payloads(), "c#1")) == down_record


def test_the_settings_defaults_apply_when_the_check_sets_none(r, keys, store):
    make(store)  # defaults: 3 failures, 2 successes
    results = [
        run_once(r, keys, store.settings, store.params, "c@eu", False, T0 + i) for i in range(3)
    ]
    assert [t for _, t in results] == [None, None, "c#1"]


def test_a_majority_of_regions_by_default_and_a_set_quorum(r, keys, store):
    make(store, uid="m", regions=("eu", "us", "ap"), failure_threshold=1)
    s, p = store.settings, store.params
    assert run_once(r, keys, s, p, "m@eu", False, T0)[1] is None  # 1 of 3 down: still up
    assert state_of(r, keys, "m")[CheckStateField.OBSERVED] == "up"
    assert run_once(r, keys, s, p, "m@us", False, T0 + 1)[1] == "m#1"  # 2 of 3: down
    make(store, uid="q", regions=("eu", "us", "ap"), failure_threshold=1, quorum=3)
    assert run_once(r, keys, s, p, "q@eu", False, T0)[1] is None
    assert run_once(r, keys, s, p, "q@us", False, T0)[1] is None
    assert run_once(r, keys, s, p, "q@ap", False, T0)[1] == "q#1"
    transition = read_transitions(r, keys.check_transitions("q"))[0]
    assert {region: v["state"] for region, v in transition["regions"].items()} == {
        "eu": "down",
        "us": "down",
        "ap": "down",
    }


def test_a_run_that_moves_no_region_counts_again_after_the_quorum_or_regions_changed(
    r, keys, store
):
    """A run whose region's state does not move skips the quorum count, unless the quorum or
    the regions it was counted over changed since: then the next run of any region counts."""
    make(store, uid="e", regions=("eu", "us", "ap"), failure_threshold=1)
    s, p = store.settings, store.params
    assert run_once(r, keys, s, p, "e@eu", False, T0)[1] is None  # 1 of 3 down, quorum 2: up
    assert run_once(r, keys, s, p, "e@eu", False, T0 + 60)[1] is None  # eu stays down
    assert run_once(r, keys, s, p, "e@us", True, T0 + 61)[1] is None  # us stays up
    store.update("e", now=at(T0 + 62), quorum=1)
    assert run_once(r, keys, s, p, "e@ap", True, T0 + 63)[1] == "e#1"  # ap stays up: 1 of 3
    assert state_of(r, keys, "e")[CheckStateField.STATE] == "down"
    store.update("e", now=at(T0 + 64), quorum=None, regions=["us", "ap"])  # eu removed
    assert run_once(r, keys, s, p, "e@us", True, T0 + 65)[1] == "e#2"  # 0 of 2 down: up
    assert state_of(r, keys, "e")[CheckStateField.STATE] == "up"


def test_a_held_change_is_made_by_the_next_run_of_any_region_once_its_window_is_gone(
    r, keys, store
):
    """A window holds eu's failure back; once the window is gone, the next run of *another*
    region, whose own state does not move, counts again and makes the transition (every
    region's job carries the hold while it lasts, and none does after)."""
    make(store, uid="h", regions=("eu", "us"), failure_threshold=1, success_threshold=1, quorum=1)
    s, p = store.settings, store.params
    start = (T0 // 3600) * 3600 + 60
    assert run_once(r, keys, s, p, "h@us", True, start)[1] is None  # counted once, up
    windows = MaintenanceStore(r, keys)
    window = windows.add(validate_window(uid="h", cron="0 * * * *", duration=1800, timezone="UTC"))
    assert run_once(r, keys, s, p, "h@eu", False, start + 1)[1] is None  # held
    held = [r.hget(keys.job(f"h@{region}"), JobField.HOLD) for region in ("eu", "us")]
    assert held == ["1", "1"] and CheckStateField.HELD_UNTIL in state_of(r, keys, "h")
    assert windows.remove(window.id)
    assert run_once(r, keys, s, p, "h@us", True, start + 2)[1] == "h#1"  # us still up: counts
    assert state_of(r, keys, "h")[CheckStateField.STATE] == "down"
    assert [r.hget(keys.job(f"h@{region}"), JobField.HOLD) for region in ("eu", "us")] == [
        None,
        None,
    ]
    assert run_once(r, keys, s, p, "h@us", True, start + 3)[1] is None  # nothing to count


def test_degraded_results_make_a_degraded_check(r, keys, store):
    make(store, failure_threshold=2, success_threshold=1)
    s, p = store.settings, store.params
    assert run_once(r, keys, s, p, "c@eu", True, T0, degraded="slow")[1] is None
    assert run_once(r, keys, s, p, "c@eu", True, T0 + 1, degraded="slow")[1] == "c#1"
    assert read_transitions(r, keys.check_transitions("c"))[0]["to"] == "degraded"
    assert run_once(r, keys, s, p, "c@eu", True, T0 + 2)[1] == "c#2"  # plain success: up


def test_the_lua_quorum_agrees_with_the_pure_rule(r, keys, store):
    make(store, uid="z", regions=("eu", "us", "ap"), failure_threshold=1, success_threshold=1)
    s, p = store.settings, store.params
    rng = random.Random(17)
    regions = {"eu": State.UP, "us": State.UP, "ap": State.UP}
    for i in range(60):
        region = rng.choice(list(regions))
        kind = rng.choice([State.UP, State.DOWN, State.DEGRADED])
        run_once(
            r, keys, s, p, f"z@{region}", kind != State.DOWN, T0 + i,
            degraded="slow" if kind == State.DEGRADED else None,
        )  # fmt: skip
        regions[region] = kind
        expected = overall_state(list(regions.values()), 2)
        assert state_of(r, keys, "z")[CheckStateField.OBSERVED] == expected, (i, regions)
        assert state_of(r, keys, "z").get(CheckStateField.STATE, "up") == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_threshold", 0),
        ("failure_threshold", 101),
        ("success_threshold", "many"),
        ("success_threshold", True),
        ("quorum", 2),  # one region only
        ("quorum", 0),
    ],
)
def test_bad_thresholds_are_refused_naming_the_field_and_write_nothing(
    r, keys, store, field, value
):
    with pytest.raises(CheckFieldError) as err:
        make(store, uid="bad", **{field: value})
    assert err.value.field == field
    assert "must be an integer" in str(err.value)
    assert not r.exists(keys.check("bad"))


def test_updates_and_the_repair_keep_the_state(r, keys, store):
    keys = keys.of_check("c")  # its outbox, claims and indexes are its partition's
    make(store, regions=("eu", "us"), failure_threshold=1, quorum=1)
    s, p = store.settings, store.params
    assert run_once(r, keys, s, p, "c@eu", False, T0)[1] == "c#1"
    store.update("c", now=at(T0 + 1), period=120, failure_threshold=2)
    assert read_job(r, keys, "c@eu").health.state == State.DOWN
    assert read_job(r, keys, "c@eu").failure_threshold == 2
    store.update("c", now=at(T0 + 2), failure_threshold=None)  # back to the default
    assert read_job(r, keys, "c@eu").failure_threshold is None
    r.delete(keys.due())  # a restore lost the index: the repair places the jobs again
    report = repair(r, keys, p, at(T0 + 3))
    assert report.placed
    assert read_job(r, keys, "c@eu").health.state == State.DOWN
    assert state_of(r, keys, "c")[CheckStateField.STATE] == "down"
    store.delete("c")
    assert not r.exists(keys.check_state("c")) and not r.exists(keys.check_transitions("c"))


def test_a_lost_run_counts_as_a_failure(r, keys, store, dispatcher_app, broker):
    make(store, failure_threshold=1)
    from support.workers import claim_by_hand

    claim_by_hand(r, keys, "c@eu", "lost", lease_s=1)
    d = Dispatcher(dispatcher_app, client=r, partition=keys.of_check("c").partition)
    assert d.reap(time.time() + 100) == 1
    assert read_job(r, keys, "c@eu").health.state == State.DOWN
    assert state_of(r, keys, "c")[CheckStateField.STATE] == "down"


def test_one_claim_one_run_per_transition(r, keys, store):
    keys = keys.of_check("c")  # its outbox, claims and indexes are its partition's
    make(store, failure_threshold=1)
    s = store.settings
    tid = run_once(r, keys, s, store.params, "c@eu", False, T0)[1]
    # two publishers (the worker, a beat): one claim within a lease
    assert claim(r, keys, s, T0, [tid]) == [tid]
    assert claim(r, keys, s, T0 + 1) == []
    assert claim(r, keys, s, T0 + 1, [tid]) == []
    # two deliveries of it: one runs, the other finds it busy; after the end, done
    assert start_delivery(r, keys, s, tid, "a", T0 + 2)[0] == TransitionStart.RUN
    assert start_delivery(r, keys, s, tid, "b", T0 + 2)[0] == TransitionStart.BUSY
    assert start_delivery(r, keys, s, tid, "a", T0 + 2)[0] == TransitionStart.RUN  # redelivery
    assert finish_delivery(r, keys, tid, "b", DeliveryOutcome.DELIVERED, T0 + 3) is False
    assert finish_delivery(r, keys, tid, "a", DeliveryOutcome.DELIVERED, T0 + 3) is True
    assert start_delivery(r, keys, s, tid, "b", T0 + 4)[0] == TransitionStart.DONE
    assert claim(r, keys, s, T0 + 10**6) == []
    assert not r.hexists(keys.transition_payloads(), tid)


def test_a_lapsed_claim_is_claimed_again(r, keys, store):
    keys = keys.of_check("c")  # its outbox, claims and indexes are its partition's
    make(store, failure_threshold=1)
    s = store.settings
    tid = run_once(r, keys, s, store.params, "c@eu", False, T0)[1]
    assert claim(r, keys, s, T0, [tid]) == [tid]
    lease = s.transition_timeout + 2
    assert claim(r, keys, s, T0 + lease - 0.5) == []
    assert claim(r, keys, s, T0 + lease + 0.5) == [tid]
    # each claim doubles the lease: an unconsumed queue gets ever rarer copies
    again = T0 + lease + 0.5
    assert claim(r, keys, s, again + 2 * lease - 0.5) == []
    assert claim(r, keys, s, again + 2 * lease + 0.5) == [tid]
    assert r.hget(keys.transition_claims(), tid) == "3"
    start_delivery(r, keys, s, tid, "o", again + 3 * lease)
    finish_delivery(r, keys, tid, "o", DeliveryOutcome.DELIVERED, again + 3 * lease)
    assert not r.hexists(keys.transition_claims(), tid)


# --- maintenance -----------------------------------------------------------------------------


def test_a_transition_inside_a_window_is_held_and_delivered_at_its_end(r, keys, store):
    keys = keys.of_check("c")  # its outbox, claims and indexes are its partition's
    make(store, failure_threshold=1, success_threshold=1)
    s, p = store.settings, store.params
    # every hour at :00 for 30 minutes; T0 is inside one: find its end
    window = validate_window(uid="c", cron="0 * * * *", duration=1800, timezone="UTC")
    MaintenanceStore(r, keys).add(window)
    start = (T0 // 3600) * 3600 + 60  # one minute into a window
    end = start - 60 + 1800
    assert run_once(r, keys, s, p, "c@eu", False, start)[1] is None  # held
    last = json.loads(r.hget(keys.last_result("c"), "eu"))
    assert last["maintenance"] is True
    state = state_of(r, keys, "c")
    assert state[CheckStateField.OBSERVED] == "down" and CheckStateField.STATE not in state
    assert float(state[CheckStateField.HELD_UNTIL]) == end
    assert release_held(r, keys, s, start + 60) == []  # not yet over
    assert release_held(r, keys, s, end + 1) == ["c#1"]  # still down at the end: delivered
    transition = read_transitions(r, keys.check_transitions("c"))[0]
    assert (transition["to"], transition["held"]) == ("down", True)
    assert r.zcard(keys.maintenance_held()) == 0


def test_a_change_undone_inside_the_window_is_never_delivered(r, keys, store):
    make(store, failure_threshold=1, success_threshold=1)
    s, p = store.settings, store.params
    MaintenanceStore(r, keys).add(
        validate_window(tenant="acme", cron="0 * * * *", duration=1800, timezone="UTC")
    )
    start = (T0 // 3600) * 3600 + 60
    run_once(r, keys, s, p, "c@eu", False, start)
    run_once(r, keys, s, p, "c@eu", True, start + 60)  # recovered inside the window
    assert release_held(r, keys, s, start + 3600) == []
    assert r.xlen(keys.check_transitions("c")) == 0
    # after the window, a change is delivered at once
    assert run_once(r, keys, s, p, "c@eu", False, start + 1800)[1] == "c#1"


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("cron", {"cron": "61 * * * *"}),
        ("cron", {"cron": "0 0 30 2 *"}),
        ("duration", {"duration": 30}),
        ("duration", {"duration": 8 * 86400}),
        ("duration", {"duration": "soon"}),
        ("timezone", {"timezone": "Mars/Olympus"}),
    ],
)
def test_bad_windows_are_refused_naming_the_field(field, raw):
    good = {"uid": "c", "cron": "0 3 * * sun", "duration": 3600, "timezone": "UTC"}
    with pytest.raises(CheckFieldError) as err:
        validate_window(**(good | raw))
    assert err.value.field == field


def test_a_window_added_or_removed_applies_to_the_next_run_despite_the_cache(r, keys, store):
    make(store, failure_threshold=1, success_threshold=1)
    s, p = store.settings, store.params
    start = (T0 // 3600) * 3600 + 60
    run_once(r, keys, s, p, "c@eu", True, start)  # caches "no windows" for the check
    windows = MaintenanceStore(r, keys)
    window = windows.add(validate_window(uid="c", cron="0 * * * *", duration=1800, timezone="UTC"))
    assert run_once(r, keys, s, p, "c@eu", False, start + 1)[1] is None  # held: window seen
    assert windows.remove(window.id)
    assert run_once(r, keys, s, p, "c@eu", False, start + 2)[1] == "c#1"  # no window any more
