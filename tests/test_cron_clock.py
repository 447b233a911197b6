"""Clock steps: nothing fires before its time because a clock jumped, nothing fires twice."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from support.clock_steps import run_stepped
from support.cron import T0, sends, store_of

from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.redis.schema import CronGapField

MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def _noop() -> None: ...


def test_clock_stepped_one_hour_ahead_and_back_fires_nothing_early_nothing_twice(
    cron_app, broker_url, r
):
    cron("* * * * *", app=cron_app, id="minutely", name="clk.minutely")(_noop)
    cron("0 * * * *", app=cron_app, id="hourly", name="clk.hourly")(_noop)

    def wall(elapsed):  # +1 h from 00:10 to 00:40 (true time), then back
        return HOUR if 10 * MIN <= elapsed < 40 * MIN else timedelta(0)

    fired = run_stepped(cron_app, r, 75 * MIN, wall)
    early = [(at, w) for runs in fired.values() for at, w in runs if w > at]
    assert early == []
    counts = sends(broker_url)
    twice = {key: n for key, n in counts.items() if n != 1}
    assert twice == {}
    for k in range(75):  # every minute window ran, exactly once
        assert counts[("minutely", GLOBAL_TENANT, window_id(T0 + k * MIN))] == 1
    assert counts[("hourly", GLOBAL_TENANT, window_id(T0 + HOUR))] == 1
    assert store_of(cron_app).gaps() == []  # the steady clock kept the stepped beat on time


def test_step_that_persists_is_followed_its_windows_are_gaps_and_none_fire_twice(
    cron_app, broker_url, r
):
    cron("* * * * *", app=cron_app, id="minutely", name="clk.minutely")(_noop)

    def wall(elapsed):  # +1 h from 00:10 to 00:30; held for 5 min, then followed
        return HOUR if 10 * MIN <= elapsed < 30 * MIN else timedelta(0)

    fired = run_stepped(cron_app, r, 95 * MIN, wall, step_hold=5 * MIN)
    counts = Counter(w for runs in fired.values() for _, w in runs)
    assert {w: n for w, n in counts.items() if n != 1} == {}
    assert all(n == 1 for n in sends(broker_url).values())
    # Nothing before the step was accepted fired early.
    assert [w for at, w in fired["stepped"] if w > at and at < T0 + 15 * MIN] == []
    gaps = [g for g in store_of(cron_app).gaps() if "clock stepped forward" in g["detector"]]
    assert gaps, store_of(cron_app).gaps()
    (gap,) = gaps
    assert gap[CronGapField.TASK] == "minutely"
    assert gap[CronGapField.COUNT] >= 50  # the hour the step skipped, as one range
