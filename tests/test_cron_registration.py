"""@cron declarations: defaults, validation at decoration, routing, per-app registry."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import BaseSchedule, schedstate

from celery_app.cron_tasks.celery_schedules import CustomSchedule, Interval
from celery_app.cron_tasks.registration import CronSpecError, Instant, cron, cron_tasks


def test_defaults_and_registry_per_app(cron_app):
    @cron("0 3 * * *", app=cron_app)
    def nightly():
        return "ok"

    tasks = cron_tasks(cron_app)
    declared = tasks[nightly.name]
    assert declared.id == nightly.name
    assert (declared.singleton, declared.per_tenant) == (True, False)
    assert declared.timeout == timedelta(minutes=5)
    assert declared.timezone == "UTC"
    assert declared.queue is None
    assert nightly.max_retries == 0
    assert nightly() == "ok"  # still a plain callable task


def test_options_and_queue_routed_through_task_routes(cron_app):
    @cron(
        "*/5 * * * *",
        app=cron_app,
        id="reports",
        per_tenant=True,
        singleton=False,
        timeout=timedelta(minutes=10),
        timezone="Europe/Berlin",
        queue="reports",
    )
    def reports(tenant: str) -> None: ...

    declared = cron_tasks(cron_app)["reports"]
    assert (declared.per_tenant, declared.singleton, declared.timezone) == (
        True,
        False,
        "Europe/Berlin",
    )
    assert declared.soft_time_limit == 600
    route = cron_app.amqp.router.route({}, reports.name, (), {}, reports)
    assert route["queue"].name == "reports"
    assert "queue" not in reports.__class__.__dict__  # not the deprecated task attribute


@pytest.mark.parametrize(
    ("spec", "token"),
    [("61 * * * *", "'61'"), ("* * * *", "4 fields"), ("* * 1-x * *", "'1-x'")],
)
def test_bad_spec_fails_at_decoration_naming_task_and_spec(cron_app, spec, token):
    with pytest.raises(CronSpecError) as caught:

        @cron(spec, app=cron_app, id="broken-task")
        def broken(): ...

    message = str(caught.value)
    assert "broken-task" in message
    assert spec in message
    assert token in message


def test_bad_declarations_name_the_field(cron_app):
    with pytest.raises(CronSpecError, match="timezone"):
        cron("* * * * *", app=cron_app, id="t1", timezone="Mars/Olympus")(_noop)
    with pytest.raises(CronSpecError, match="timeout"):
        cron("* * * * *", app=cron_app, id="t2", timeout=timedelta(0))(_noop)
    with pytest.raises(CronSpecError, match="may contain only"):
        cron("* * * * *", app=cron_app, id="has:colon")(_noop)


def _noop() -> None: ...


def test_duplicate_ids_are_refused(cron_app):
    cron("* * * * *", app=cron_app, id="same", name="mod.a")(_noop)
    cron("* * * * *", app=cron_app, id="same", name="mod.b")(_noop)
    with pytest.raises(CronSpecError, match="declared twice"):
        cron_tasks(cron_app)


class _DueIn30(BaseSchedule):
    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 30)


def test_a_tasks_schedule_kind_decides_its_windows_anchor_and_is_due(cron_app):
    """CronTask tells its schedule's kinds apart by type: a crontab has minute windows, no
    anchor and is never asked is_due; an interval's windows are its own length, from its anchor;
    a custom schedule is asked is_due; a forced run-now's instant is one microsecond."""
    cron("*/5 * * * *", id="five", name="t.five", app=cron_app)(_noop)
    five = cron_tasks(cron_app)["five"]
    anchor = datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC)
    assert (five.window_length, five.is_interval, five.is_custom) == (
        timedelta(minutes=1),
        False,
        False,
    )
    assert five.with_anchor(anchor) is five and five.anchor is None
    with pytest.raises(TypeError, match="'five'"):
        five.is_due(anchor)

    every = replace(five, schedule=Interval(timedelta(seconds=20))).with_anchor(anchor)
    assert (every.window_length, every.is_interval, every.anchor) == (
        timedelta(seconds=20),
        True,
        anchor,
    )
    at = anchor + timedelta(seconds=45)
    assert every.window_of(at) == anchor + timedelta(seconds=40)  # counted from the anchor

    custom = replace(five, schedule=CustomSchedule(_DueIn30()))
    assert custom.is_custom and not custom.is_interval
    assert custom.is_due(at) == (True, 30.0)  # the schedule's own answer

    instant = replace(five, schedule=Instant())
    assert (instant.window_length, instant.is_interval) == (timedelta(microseconds=1), True)
    assert instant.window_of(at) == at and instant.next_fire(at) is None
