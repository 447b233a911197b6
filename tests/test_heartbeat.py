"""Heartbeat checks (``celery_app/checks/heartbeat.py``): a job pings, silence past the period
and grace is a failed run recorded by beat's dispatcher with no worker, a start with no success
within ``max_duration`` too; states, thresholds and transitions are every check's (each
transition made once); bad pings change nothing. Real Redis, the dispatcher's own tick."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from support.polling import wait_for

from celery_app.checks.check_state import read_transitions
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.heartbeat import Ping, PingKind, PingRefused, record_ping
from celery_app.checks.jobs import read_job
from celery_app.errors import CheckFieldError
from celery_app.redis.schema import CheckStateField
from scheduling_core.cron import parse
from scheduling_core.heartbeat import HeartbeatSchedule


def _heartbeat(store, uid: str = "nightly", **config) -> str:
    store.create(
        uid=uid, tenant="acme", kind="heartbeat", target="the nightly backup", period=1,
        regions=["eu"], failure_threshold=1, success_threshold=1,
        config={"grace": 0, "token": "t" * 20, **config},
    )  # fmt: skip
    return uid


def _state(r, keys, uid: str) -> str | None:
    return r.hget(keys.check_state(uid), CheckStateField.STATE)


def _last(r, keys, uid: str) -> dict:
    return json.loads(r.hget(keys.last_result(uid), "eu"))


@pytest.mark.timeout(30)
def test_silence_is_one_failure_a_ping_brings_it_back_each_transition_once(
    r, keys, settings, store, dispatcher_app
):
    uid = _heartbeat(store)
    dispatcher = Dispatcher(dispatcher_app, client=r, partition=keys.of_check(uid).partition)
    record_ping(r, keys, settings, uid, Ping())
    job = read_job(r, keys, f"{uid}@eu")
    now = float(r.time()[0])
    assert now < job.scheduled_at <= now + 2  # the next ping is due a period (1 s) later
    assert job.runs == 1 and _last(r, keys, uid)["status"] == "up"

    def down() -> bool:
        dispatcher.tick()  # beat's tick: no worker runs a heartbeat check
        return _state(r, keys, uid) == "down"

    wait_for(down, 10, interval=0.05, what="the silent heartbeat down")
    last = _last(r, keys, uid)
    assert last["status"] == "down" and "no success ping by" in last["error"]
    late = read_job(r, keys, f"{uid}@eu")
    assert late.scheduled_at > float(r.time()[0]) - 1  # placed a period on, not in the past
    record_ping(r, keys, settings, uid, Ping(exit_status=0, body="42 files"))
    assert _state(r, keys, uid) == "up"
    up = _last(r, keys, uid)
    assert up["detail"] == {"ping": "success", "exit_status": 0, "body": "42 files"}
    moves = [
        (t["from"], t["to"]) for t in reversed(read_transitions(r, keys.check_transitions(uid)))
    ]
    assert moves == [("up", "down"), ("down", "up")]


@pytest.mark.timeout(30)
def test_a_start_with_no_success_within_max_duration_fails_and_a_fail_ping_is_down(
    r, keys, settings, store, dispatcher_app
):
    uid = _heartbeat(store, "backup", max_duration=1)
    store.update(uid, period=3600)  # only the run's duration can make it late now
    dispatcher = Dispatcher(dispatcher_app, client=r, partition=keys.of_check(uid).partition)
    seconds, micros = r.time()
    record_ping(r, keys, settings, uid, Ping(PingKind.START))
    job = read_job(r, keys, f"{uid}@eu")
    assert job.scheduled_at <= seconds + micros / 1e6 + 1.5  # brought forward to start + 1 s

    def down() -> bool:
        dispatcher.tick()
        return _state(r, keys, uid) == "down"

    wait_for(down, 10, interval=0.05, what="the overrunning run down")
    assert "no success within 1 s" in _last(r, keys, uid)["error"]
    record_ping(r, keys, settings, uid, Ping(PingKind.SUCCESS))
    assert _state(r, keys, uid) == "up"
    record_ping(r, keys, settings, uid, Ping(PingKind.FAIL, exit_status=3))
    failed = _last(r, keys, uid)
    assert failed["status"] == "down" and "exit status 3" in failed["error"]
    assert _state(r, keys, uid) == "down"


@pytest.mark.timeout(30)
def test_past_expected_duration_a_run_is_degraded_past_max_duration_down(
    r, keys, settings, store, dispatcher_app
):
    """A run still going at start + expected_duration: degraded (beat's tick, no ping); still
    going at start + max_duration: down; its late success: degraded. One transition each."""
    uid = _heartbeat(store, "slow", expected_duration=1, max_duration=2)
    store.update(uid, period=3600)  # only the run's duration can make it late now
    dispatcher = Dispatcher(dispatcher_app, client=r, partition=keys.of_check(uid).partition)
    record_ping(r, keys, settings, uid, Ping(PingKind.START))

    def becomes(state: str):
        def check() -> bool:
            dispatcher.tick()
            return _state(r, keys, uid) == state

        return check

    wait_for(becomes("degraded"), 10, interval=0.05, what="degraded past 1 s")
    slow = _last(r, keys, uid)
    assert slow["status"] == "up" and "still running after" in slow["degraded"]
    wait_for(becomes("down"), 10, interval=0.05, what="down past 2 s")
    assert "no success within 2 s" in _last(r, keys, uid)["error"]
    record_ping(r, keys, settings, uid, Ping(PingKind.SUCCESS))
    assert "longer than its expected 1 s" in _last(r, keys, uid)["degraded"]
    moves = [
        (t["from"], t["to"]) for t in reversed(read_transitions(r, keys.check_transitions(uid)))
    ]
    assert moves == [("up", "degraded"), ("degraded", "down"), ("down", "degraded")]


def test_a_ping_is_timed_only_from_its_own_runs_start(r, keys, settings, store):
    """A success ping ends the run a start ping began: a later success with no start of its own
    has no duration, and is not judged slow from the old start."""
    uid = _heartbeat(store, "sometimes", expected_duration=1)
    store.update(uid, period=3600)
    record_ping(r, keys, settings, uid, Ping(PingKind.START))
    record_ping(r, keys, settings, uid, Ping(PingKind.SUCCESS))
    timed = _last(r, keys, uid)
    assert timed["duration_ms"] is not None and timed["duration_ms"] < 1000
    began = timed["started_at"]
    wait_for(lambda: r.time()[0] > datetime.fromisoformat(began).timestamp() + 1.5, 5)
    record_ping(r, keys, settings, uid, Ping(PingKind.SUCCESS))  # a run that sent no start
    untimed = _last(r, keys, uid)
    assert untimed["duration_ms"] is None and untimed["started_at"] is None
    assert untimed["degraded"] is None and _state(r, keys, uid) in (None, "up")
    assert read_transitions(r, keys.check_transitions(uid)) == []


def test_bad_pings_are_refused_naming_what_and_change_nothing(r, keys, settings, store, test_kind):
    uid = _heartbeat(store)
    store.create(uid="web", tenant="acme", kind=test_kind, target="x", period=60)
    before = r.hgetall(keys.job(f"{uid}@eu"))
    for call, field in [
        (lambda: record_ping(r, keys, settings, "nope", Ping()), "uid"),
        (lambda: record_ping(r, keys, settings, "web", Ping()), "uid"),
        (lambda: record_ping(r, keys, settings, uid, Ping(), token="w" * 20), "token"),
        (lambda: record_ping(r, keys, settings, uid, Ping(body="x" * 10_001)), "body"),
        (lambda: record_ping(r, keys, settings, uid, Ping(next_at=-1.0)), "next_at"),
    ]:
        with pytest.raises(PingRefused) as refused:
            call()
        assert refused.value.field == field
    assert r.hgetall(keys.job(f"{uid}@eu")) == before
    assert record_ping(r, keys, settings, uid, Ping(), token="t" * 20).written == 1


def test_a_late_heartbeat_waiting_for_beat_is_indexed_for_the_repair(r, keys, settings, store):
    from celery_app.checks.claiming import Promotions, promote_due
    from celery_app.checks.jobs import from_unix
    from celery_app.checks.repair import repair
    from celery_app.redis.clock import server_time
    from scheduling_core import Params

    now = server_time(r)
    uid = "late"
    store.create(uid=uid, tenant="acme", kind="heartbeat", target="a job", period=1,
                 regions=["eu"], config={"grace": 0},
                 now=from_unix(now - 30))  # fmt: skip  # its deadline passed
    moved = Promotions()
    assert promote_due(r, keys.of_check(uid), now, 100, moved) == 1
    assert moved.late == 1 and not +moved.ready  # counted as late, not as ready
    assert r.zscore(keys.of_check(uid).heartbeats_late(), f"{uid}@eu") is not None
    report = repair(r, keys, Params.from_settings(settings), from_unix(now))
    assert f"{uid}@eu" not in report.placed  # waiting for beat's miss: not lost, not placed twice
    assert r.zscore(keys.of_check(uid).due(), f"{uid}@eu") is None


def test_config_is_validated_and_a_token_made_when_none_is_given(store):
    made = store.create(uid="hb", tenant="acme", kind="heartbeat", target="job", period=60)
    assert len(made.config["token"]) >= 16 and made.config["grace"] == 60
    for config, field in [
        ({"grace": -1}, "config.grace"),
        ({"cron": "61 * * * *"}, "config.cron"),
        ({"timezone": "Europe/Paris"}, "config.timezone"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "config.timezone"),
        ({"max_duration": 0}, "config.max_duration"),
        ({"max_duration": 10, "expected_duration": 11}, "config.expected_duration"),
        ({"expected_duration": 0.5}, "config.expected_duration"),
        ({"token": "short"}, "config.token"),
        ({"colour": "red"}, "config.colour"),
    ]:
        with pytest.raises(CheckFieldError) as refused:
            store.create(uid="bad", tenant="acme", kind="heartbeat", target="job", period=60,
                         config=config)  # fmt: skip
        assert refused.value.field == field
    assert store.get("bad") is None


def test_a_cron_heartbeat_is_due_after_the_next_firing_plus_grace(r, keys, settings, store):
    config = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "grace": 600}
    made = store.create(
        uid="nightly", tenant="acme", kind="heartbeat", target="backup", period=60, config=config
    )
    now = datetime.fromtimestamp(float(r.time()[0]), UTC)
    job = read_job(r, keys, made.job_ids()[0])
    fire = parse("0 3 * * *").next_after(now.astimezone(ZoneInfo("Europe/Paris")))
    assert job.scheduled_at == pytest.approx((fire + timedelta(seconds=600)).timestamp(), abs=1)


def test_missed_deadlines_walk_one_period_at_a_time():
    every = HeartbeatSchedule(grace=timedelta(seconds=30), every=timedelta(minutes=5))
    t = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    first = every.deadline_after_success(t)
    assert first == t + timedelta(minutes=5, seconds=30)
    assert every.deadline_after_miss(first) == first + timedelta(minutes=5)
    started = every.deadline_after_start(t, first)
    assert started == first  # duration not watched
    watched = HeartbeatSchedule(grace=timedelta(0), every=timedelta(hours=1),
                                max_duration=timedelta(minutes=10))  # fmt: skip
    assert watched.deadline_after_start(t, t + timedelta(hours=1)) == t + timedelta(minutes=10)
