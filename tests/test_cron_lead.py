"""Firing a cron window ahead and starting it on time (celery_app.cron_tasks.lead, the engine's
lead, cron_start.lua's refusal of an early start), against a real Redis.

The worker's wait is on Redis's clock: these tests read Redis ``TIME`` to judge it, never this
process's clock (only the fallback when Redis cannot be reached waits on the local clock).
The same under real skewed processes: tests/faults/test_cron_lead_skew.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from celery import Celery
from support.cron import T0, end_runs, make_engine

from celery_app.cron_tasks.cron_state import CronStore, Early
from celery_app.cron_tasks.lead import (
    fire_lead,
    real_instant,
    start_on_time,
    wait_locally,
    workers_wait,
)
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.factory import install
from celery_app.redis.schema import CronSkipReason, CronStateField, Keys
from celery_app.wall_clock import Clock
from scheduling_core.on_tick import MAX_LEAD_S

KEYS = Keys("cbtest")
MIN = timedelta(minutes=1)
LEAD = timedelta(milliseconds=50)


def second_id(at: datetime) -> str:
    """An interval task's window id: the second ``at`` falls in."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def redis_now(r) -> datetime:
    sec, usec = r.time()
    return datetime.fromtimestamp(sec + usec / 1e6, UTC)


def store(r) -> CronStore:
    return CronStore(r, KEYS, timedelta(seconds=60))


def test_the_engine_fires_a_window_within_its_lead_once_and_never_counts_it_missed(cron_app, r):
    @cron("* * * * *", app=cron_app, id="lead", name="lead.t")
    def task():
        pass

    engine = make_engine(cron_app)
    engine.lead = LEAD
    engine.tick(T0 + timedelta(seconds=1))  # the first window: announce, fire T0
    end_runs(r)
    window = T0 + MIN
    assert engine.next_due() == window
    assert engine.next_fire() == window - LEAD
    assert not engine.tick(window - timedelta(milliseconds=60)).fired  # before the lead
    report = engine.tick(window - timedelta(milliseconds=40))
    assert [(f.task_id, f.window) for f in report.fired] == [("lead", window)]
    assert not any(s.reason == CronSkipReason.MISSED for s in report.skipped)
    # at the window's start and later in it: nothing fires again
    assert not engine.tick(window).fired
    assert not engine.tick(window + timedelta(seconds=30)).fired
    state = r.hgetall(KEYS.cron_state("lead", GLOBAL_TENANT))
    assert state[CronStateField.FIRED] == "2"
    assert CronStateField.LAST_SKIP_REASON not in state


def test_an_early_start_writes_nothing_and_says_how_long_to_wait_on_redis_time(r):
    window = second_id(redis_now(r) + timedelta(seconds=2))
    start = datetime.fromisoformat(window)
    answer = store(r).run_started(
        "t", GLOBAL_TENANT, window, False, T0, celery_id="c-1", not_before=start
    )
    assert isinstance(answer, Early)
    assert 0.0 < answer.wait_s <= 2.0  # the window starts within 2 s; a slow call eats into it
    assert r.get(KEYS.cron_run("t", GLOBAL_TENANT, window)) is None
    assert r.hgetall(KEYS.cron_state("t", GLOBAL_TENANT)) == {}
    assert r.hgetall(KEYS.cron_stats("t")) == {}


def test_a_started_window_runs_once_whatever_the_callers_clock_says(r):
    window = second_id(redis_now(r) - timedelta(seconds=1))
    start = datetime.fromisoformat(window)
    s = store(r)
    # the caller's clock an hour behind: only Redis's decides, and the window has started
    behind = start - timedelta(hours=1)
    assert s.run_started("t", GLOBAL_TENANT, window, False, behind, "c-1", not_before=start) is None
    second = s.run_started("t", GLOBAL_TENANT, window, False, behind, "c-2", not_before=start)
    assert second == "c-1"
    assert r.get(KEYS.cron_run("t", GLOBAL_TENANT, window)) == "c-1"


def test_start_on_time_waits_for_the_window_on_redis_time_then_takes_the_run_key(r):
    window = second_id(redis_now(r) + timedelta(seconds=1))
    start = datetime.fromisoformat(window)
    # A worker clock two seconds ahead would think the window long started: it is not asked.
    ahead = lambda: datetime.now(UTC) + timedelta(seconds=2)  # noqa: E731
    first = start_on_time(
        store(r), "t", GLOBAL_TENANT, window, False, celery_id="c-1", hard_time_limit=0,
        clock=ahead,
    )  # fmt: skip
    assert first is None
    assert redis_now(r) >= start  # it returned, and wrote the key, only once the window began
    assert r.get(KEYS.cron_run("t", GLOBAL_TENANT, window)) == "c-1"
    again = start_on_time(
        store(r), "t", GLOBAL_TENANT, window, False, celery_id="c-2", hard_time_limit=0
    )
    assert again == "c-1"  # a second delivery of the window is suppressed, as before
    state = r.hgetall(KEYS.cron_state("t", GLOBAL_TENANT))
    assert state[CronStateField.SUPPRESSED] == "1"


def test_the_wait_is_bounded_and_a_far_early_delivery_is_logged(r, caplog):
    window = second_id(redis_now(r) + timedelta(hours=1))
    pauses: list[float] = []
    with caplog.at_level(logging.WARNING, logger="celery_app.cron_tasks.lead"):
        first = start_on_time(
            store(r), "t", GLOBAL_TENANT, window, False, celery_id="c-1", hard_time_limit=0,
            max_wait_s=0.2, sleep=pauses.append,
        )  # fmt: skip
    assert first is None  # it runs rather than parking the slot for an hour
    assert sum(pauses) <= 0.2 + 1e-9
    assert "before its window on Redis's clock" in caplog.text
    assert r.get(KEYS.cron_run("t", GLOBAL_TENANT, window)) == "c-1"


def test_a_test_clock_window_is_mapped_to_the_real_instant_it_stands_for():
    real = Clock()
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert real_instant(at, real) == at
    simulated = Clock(datetime(2030, 1, 1, tzinfo=UTC), 1_000.0, 30.0)
    # 60 simulated seconds after the clock's start are 2 real seconds after its epoch
    assert real_instant(at + MIN, simulated).timestamp() == 1_002.0


def test_the_lead_applies_only_when_workers_run_checkbeats_recording(cron_app):
    settings = cron_app.conf.checkbeat_settings
    assert settings.cron_lead == 0.05
    plain = Celery("plain", broker="memory://", set_as_current=False)
    plain.conf.beat_schedule = {"p": {"task": "p.t", "schedule": 1.0}}
    plain.conf.checkbeat_settings = settings
    beat_only = list(all_tasks(plain).values())
    assert beat_only and not workers_wait(plain, beat_only)
    assert fire_lead(plain, beat_only) == timedelta(0)  # a plain worker would run it early
    plain.conf.imports = ("celery_app.cron_tasks.recording",)
    assert fire_lead(plain, beat_only) == timedelta(seconds=0.05)
    plain.conf.imports = ()
    install(plain)
    assert fire_lead(plain, beat_only) == timedelta(seconds=0.05)

    @cron("* * * * *", app=cron_app, id="decl", name="lead.decl")
    def decl():
        pass

    declared = list(cron_tasks(cron_app).values())
    assert workers_wait(Celery("other", set_as_current=False), declared)  # every task @cron


def test_without_redis_a_run_still_waits_for_its_window_on_the_local_clock():
    pauses: list[float] = []
    soon = second_id(datetime.now(UTC) + timedelta(seconds=2))
    wait_locally(soon, sleep=pauses.append)
    wait_locally(second_id(datetime.now(UTC) - timedelta(seconds=2)), sleep=pauses.append)
    wait_locally(second_id(datetime.now(UTC) + timedelta(hours=1)), sleep=pauses.append)
    wait_locally("not a window", sleep=pauses.append)
    assert len(pauses) == 2  # the window 2 s ahead, and the bounded one an hour ahead
    assert 1.0 < pauses[0] <= 2.0
    assert pauses[1] == MAX_LEAD_S
