"""``celery -A celery_app schedule list|run|diagnose|add|update|rm|pause|resume``: cron tasks
from any machine, and runtime schedules (:mod:`celery_app.cron_tasks.runtime`).

``add`` and ``update`` validate every field before anything is written: a bad one exits 1 with
one line naming it (``--every: must be ...``), and Redis is untouched.

``diagnose`` exits 1 when it reports anything, so it can serve as a health probe; every command
exits 2 with one line when it cannot run (Redis unreachable, bad settings: ``cli.common``), and
with one line per entry when the schedule cannot be loaded (every broken ``beat_schedule``
entry, a task id declared twice).
"""

from __future__ import annotations

import json

import click
from celery.bin.base import handle_preload_options

from celery_app.cli.common import EXIT_PROBLEM, CannotRun, CheckbeatGroup, load_app
from celery_app.cli.terminal import escape
from celery_app.cron_tasks.celery_schedules import BeatEntryError
from celery_app.cron_tasks.registration import CronSpecError
from celery_app.cron_tasks.runtime import (
    RuntimeSchedule,
    ScheduleConflict,
    ScheduleInputError,
    add_schedule,
    pause_schedule,
    remove_schedule,
    resume_schedule,
    update_schedule,
)
from celery_app.cron_tasks.service import CronService, CronUsageError, row_dict
from celery_app.redis.schema import CronOutcome, CronStateField


def _service(ctx: click.Context) -> CronService:
    try:
        return CronService(load_app(ctx))
    except (BeatEntryError, CronSpecError) as exc:  # the schedule cannot be loaded
        raise CannotRun(str(exc)) from None


@click.group(name="schedule", cls=CheckbeatGroup)
@click.pass_context
@handle_preload_options
def schedule(ctx: click.Context) -> None:
    """Scheduled tasks: list, run now, diagnose; add, update, rm, pause, resume runtime ones."""


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every cron task: spec, timezone, scope, next fire, last run and outcome."""
    rows = _service(ctx).rows()
    if as_json:
        click.echo(json.dumps([row_dict(r) for r in rows], indent=2))
        return
    header = (
        "ID",
        "SOURCE",
        "SPEC",
        "TZ",
        "SCOPE",
        "SINGLETON",
        "TIMEOUT",
        "GRACE",
        "OVERLAP",
        "NEXT",
        "LAST RUN",
        "OUTCOME",
    )
    table = [header]
    for r in rows:
        outcome = r.last_outcome or "-"
        if r.last_error and outcome != "success":
            outcome = f"{outcome}: {r.last_error}"
        table.append(
            (
                r.id if r.name == r.id else f"{r.id} ({r.name})",
                r.source,
                r.spec,
                r.timezone,
                r.scope,
                "yes" if r.singleton else "no",
                f"{r.timeout_s:g}s",
                f"{r.grace_s:g}s",
                r.overlap,
                "paused" if r.paused else r.next_fire or "never",
                r.last_end or r.last_start or "-",
                outcome,
            )
        )
    table = [tuple(escape(cell) for cell in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[-1]]))


@schedule.command(name="run")
@click.argument("task_id")
@click.option("--tenant", default=None, help="Tenant to run a per-tenant task for.")
@click.option("--wait", is_flag=True, help="Wait for the worker to finish and print the outcome.")
@click.pass_context
def run(ctx: click.Context, task_id: str, tenant: str | None, wait: bool) -> None:
    """Run one task now, through the same window lock and recording as the beat."""
    service = _service(ctx)
    try:
        result = service.run_now(task_id, tenant)
    except CronUsageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.message)
    if result.publish_error is not None:
        # The broker is down: the window is recorded as send-failed, and the command could
        # not do its job (exit 2, one line naming the broker), like any unreachable Redis.
        raise result.publish_error
    if not result.sent:
        ctx.exit(EXIT_PROBLEM)
    if wait:
        task = service.tasks[task_id]
        timeout = (service.settings.cron_grace.total_seconds() + 60) + task.hard_time_limit
        state = service.wait_for_run(result, timeout)
        outcome = state.get(CronStateField.OUTCOME, "unknown")
        if outcome == CronOutcome.SUCCESS:
            click.echo("outcome: success")
            return
        error = state.get(CronStateField.LAST_ERROR, "")
        click.echo(escape(f"outcome: {outcome}: {error}".rstrip(": ")))
        ctx.exit(EXIT_PROBLEM)


@schedule.command(name="diagnose")
@click.option("--json", "as_json", is_flag=True, help="Findings as a JSON list.")
@click.pass_context
def diagnose(ctx: click.Context, as_json: bool) -> None:
    """Overdue and failing tasks, missing tenants provider, no live beat. Exit 1 if any."""
    findings = _service(ctx).diagnose()
    if as_json:
        click.echo(json.dumps(findings, indent=2))
    elif findings:
        for finding in findings:
            click.echo(f"- {escape(finding)}")
    else:
        click.echo("ok: no findings")
    if findings:
        ctx.exit(EXIT_PROBLEM)


# --- runtime schedules ----------------------------------------------------------------------

_FLAG_OF = {
    "id": "ID",
    "task": "--task",
    "cron": "--cron",
    "every": "--every",
    "cron/every": "--cron/--every",
    "args": "--args",
    "kwargs": "--kwargs",
    "queue": "--queue",
    "per_tenant": "--per-tenant",
    "timezone": "--timezone",
    "timeout": "--timeout",
    "grace": "--grace",
    "overlap": "--overlap",
}


def _runtime_call(ctx: click.Context, action, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run one runtime change; a refused one is one line naming the flag, exit 1."""
    app = load_app(ctx)
    try:
        return action(app, *args, **kwargs)
    except ScheduleInputError as exc:
        flag = _FLAG_OF.get(exc.field, exc.field)
        raise click.ClickException(f"{flag}: {exc.problem}") from None
    except BeatEntryError as exc:  # the code's schedule cannot be loaded
        raise CannotRun(str(exc)) from None
    except (ScheduleConflict, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _describe(schedule: RuntimeSchedule) -> str:
    state = " (paused)" if schedule.paused else ""
    return f"{schedule.id}: {schedule.task} {schedule.schedule_text}{state}"


def _schedule_options(command):  # type: ignore[no-untyped-def]
    for option in reversed(
        [
            click.option("--task", "task", help="The Celery task name to send."),
            click.option("--cron", "cron", help="A cron spec (5 fields, Vixie rules)."),
            click.option("--every", "every", help="An interval: 20s, 5m, 1h30m, 90 ..."),
            click.option("--args", "args", help="Positional arguments, a JSON list."),
            click.option("--kwargs", "kwargs", help="Keyword arguments, a JSON object."),
            click.option("--queue", "queue", help="Queue to send to (default: the router's)."),
            click.option(
                "--per-tenant/--global", "per_tenant", default=None, help="Once per tenant."
            ),
            click.option("--timezone", "timezone", help="IANA zone of a cron spec."),
            click.option("--timeout", "timeout", help="Soft time limit (default 5m)."),
            click.option("--grace", "grace", help="How late a missed window may still fire."),
            click.option(
                "--overlap",
                "overlap",
                help="skip (default): no window while a run is in flight; allow: fire anyway.",
            ),
        ]
    ):
        command = option(command)
    return command


def _given(**fields):  # type: ignore[no-untyped-def]
    return {k: v for k, v in fields.items() if v is not None}


@schedule.command(name="add")
@click.argument("schedule_id")
@_schedule_options
@click.pass_context
def add(ctx: click.Context, schedule_id: str, **fields: object) -> None:
    """Schedule a task at runtime: every beat fires it from its next tick."""
    given = _given(**fields)
    if "task" not in given:
        raise click.ClickException("--task: required (the Celery task name to send)")
    created = _runtime_call(ctx, add_schedule, schedule_id, **given)
    click.echo(f"added {_describe(created)}")


@schedule.command(name="update")
@click.argument("schedule_id")
@_schedule_options
@click.pass_context
def update(ctx: click.Context, schedule_id: str, **fields: object) -> None:
    """Change fields of a runtime schedule (the others keep their values)."""
    given = _given(**fields)
    if not given:
        raise click.ClickException("nothing to update: give at least one option")
    changed = _runtime_call(ctx, update_schedule, schedule_id, **given)
    click.echo(f"updated {_describe(changed)}")


@schedule.command(name="rm")
@click.argument("schedule_id")
@click.pass_context
def rm(ctx: click.Context, schedule_id: str) -> None:
    """Remove a runtime schedule: no beat fires it after its next tick."""
    _runtime_call(ctx, remove_schedule, schedule_id)
    click.echo(f"removed {schedule_id}")


@schedule.command(name="pause")
@click.argument("schedule_id")
@click.pass_context
def pause(ctx: click.Context, schedule_id: str) -> None:
    """Keep a runtime schedule but fire nothing until ``resume``."""
    click.echo(f"paused {_describe(_runtime_call(ctx, pause_schedule, schedule_id))}")


@schedule.command(name="resume")
@click.argument("schedule_id")
@click.pass_context
def resume(ctx: click.Context, schedule_id: str) -> None:
    """Fire a paused runtime schedule again."""
    click.echo(f"resumed {_describe(_runtime_call(ctx, resume_schedule, schedule_id))}")
