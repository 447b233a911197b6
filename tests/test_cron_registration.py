"""@cron declarations: defaults, validation at decoration, routing, per-app registry."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_app.cron_tasks.registration import CronSpecError, cron, cron_tasks


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
