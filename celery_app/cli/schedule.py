"""``celery -A celery_app schedule list|run|diagnose|add|update|rm|pause|resume``: cron tasks
from any machine, and runtime schedules (:mod:`celery_app.cron_tasks.runtime`).

``add`` and ``update`` validate every field before anything is written: a bad one exits 2 with
one line naming it (``--every: must be ...``), and Redis is untouched. ``--task`` must name a task
the app knows, unless ``--remote-task`` says it is registered only on the workers.

``diagnose`` exits 1 when it reports anything, so it can serve as a health probe; every command
exits 2 with one line when it cannot run (Redis unreachable, bad settings: ``cli.common``), and
with one line per entry when the schedule cannot be loaded (every broken ``beat_schedule``
entry, a task id declared twice).

``run`` exits 0 when the run was sent (with ``--wait``: and succeeded), 1 when it was refused or
the run failed, and 3 (:data:`EXIT_UNKNOWN`) when ``--wait`` could not learn the outcome within
its timeout (the workers do not record runs and there is no result backend, or neither said
anything in time).
"""

from __future__ import annotations

import json
import re
import time

import click
from celery.bin.base import handle_preload_options

from celery_app.cli.common import (
    EXIT_PROBLEM,
    BadInput,
    CannotRun,
    CheckbeatGroup,
    findings_json_option,
    load_app,
)
from celery_app.cli.terminal import escape
from celery_app.cron_tasks import recorders
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
from celery_app.cron_tasks.service import CronService, CronUsageError, applied_timeout, row_dict
from celery_app.factory import settings_of
from celery_app.findings import findings_json
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronOutcome, CronSource, Overlap

#: ``schedule run --wait`` exit code: the run was sent, its outcome could not be learnt.
EXIT_UNKNOWN = 3


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
    table: list[tuple[str, ...]] = [header]
    for r in rows:
        never = "-" if r.runs_recorded else "not recorded"
        outcome = r.last_outcome or never
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
                "-" if r.timeout_s is None else f"{r.timeout_s:g}s",
                f"{r.grace_s:g}s",
                r.overlap,
                "paused" if r.paused else r.next_fire or "never",
                r.last_end or r.last_start or never,
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
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds --wait waits at most (default: the grace + 60 s + the time limit).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Run now even if the current window already fired (recorded as a manual run).",
)
@click.pass_context
def run(
    ctx: click.Context,
    task_id: str,
    tenant: str | None,
    wait: bool,
    timeout: float | None,
    force: bool,
) -> None:
    """Run one task now, through the same window lock and recording as the beat."""
    service = _service(ctx)
    try:
        result = service.run_now(task_id, tenant, force=force)
    except CronUsageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.message)
    if result.publish_error is not None:
        # The broker is down: the window is recorded as send-failed, and the command could
        # not do its job (exit 2, one line naming the broker), like any unreachable Redis.
        raise result.publish_error
    if not result.sent:
        ctx.exit(EXIT_PROBLEM)
    if not service.recording_workers():
        click.echo(
            "note: no live worker records cron runs, so this run's start and outcome will not "
            f"be recorded; {recorders.HOW_TO_RECORD}",
            err=True,
        )
    if not wait:
        return
    if timeout is None:
        task = service.tasks[task_id]
        limit = (
            task.hard_time_limit
            if task.source != CronSource.BEAT_SCHEDULE
            else applied_timeout(service.app, task) or 0.0
        )
        timeout = service.settings.cron_grace.total_seconds() + 60 + limit
    waited = service.wait_for_run(result, timeout)
    via = "" if waited.source == "recorded" else f" (from the {waited.source})"
    if not waited.known:
        click.echo(escape(f"outcome: unknown: {waited.detail}"))
        ctx.exit(EXIT_UNKNOWN)
    if waited.outcome == CronOutcome.SUCCESS:
        click.echo(f"outcome: success{via}")
        return
    click.echo(escape(f"outcome: {waited.outcome}{via}: {waited.detail}".rstrip(": ")))
    ctx.exit(EXIT_PROBLEM)


@schedule.command(name="diagnose")
@findings_json_option
@click.pass_context
def diagnose(ctx: click.Context, as_json: bool) -> None:
    """Overdue and failing tasks, missing tenants provider, no live beat. Exit 1 if any."""
    service = _service(ctx)
    findings = service.diagnose()
    notes = service.notes()
    if as_json:
        click.echo(findings_json(findings))
    elif findings:
        for finding in findings:
            click.echo(f"- {escape(finding.message)}")
    else:
        click.echo("ok: no findings")
    if not as_json:
        for note in notes:
            click.echo(f"note: {escape(note)}")
    if findings:
        ctx.exit(EXIT_PROBLEM)


# --- runtime schedules ----------------------------------------------------------------------

_FIELD_NAME = re.compile(r"[a-z_/]+")
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
    "expected_duration": "--expected-duration",
}


def _runtime_call(ctx: click.Context, action, *args, **kwargs):
    """Run one runtime change; a bad field is one line naming the flag, exit 2; a refused
    change (an id taken or unknown) one line, exit 1."""
    app = load_app(ctx)
    try:
        return action(app, *args, **kwargs)
    except ScheduleInputError as exc:
        name = _FIELD_NAME.match(exc.field)
        head = name.group() if name else exc.field
        flag = _FLAG_OF.get(head, head) + exc.field[len(head) :]  # and the place inside it
        raise BadInput(f"{flag}: {exc.problem}") from None
    except BeatEntryError as exc:  # the code's schedule cannot be loaded
        raise CannotRun(str(exc)) from None
    except (ScheduleConflict, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _describe(schedule: RuntimeSchedule) -> str:
    state = " (paused)" if schedule.paused else ""
    return f"{schedule.id}: {schedule.task} {schedule.schedule_text}{state}"


def _schedule_options(command):
    for option in reversed(
        [
            click.option("--task", "task", help="The Celery task name to send."),
            click.option(
                "--remote-task",
                is_flag=True,
                help="The task is registered only on the workers (not in this app): skip the "
                "check that --task names a known task.",
            ),
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
                "--expected-duration",
                "expected_duration",
                help="How long a run should take, at most --timeout (default: the timeout); "
                "a monitored run longer than it makes the task's check degraded.",
            ),
            click.option(
                "--overlap",
                "overlap",
                help=(
                    "skip: no window while a run is in flight (add's default when a live "
                    "worker records runs, else allow); allow: fire anyway."
                ),
            ),
        ]
    ):
        command = option(command)
    return command


def _given(**fields):
    return {k: v for k, v in fields.items() if v is not None and k != "remote_task"}


@schedule.command(name="add")
@click.argument("schedule_id")
@_schedule_options
@click.pass_context
def add(ctx: click.Context, schedule_id: str, **fields: object) -> None:
    """Schedule a task at runtime: every beat fires it from its next tick."""
    given = _given(**fields)
    if "task" not in given:
        raise BadInput("--task: required (the Celery task name to send)")
    remote = bool(fields["remote_task"])
    recorded = _runs_recorded(ctx)
    chosen = "overlap" not in given and not recorded
    if chosen:
        # skip would hold every window behind a run no worker ever marks ended: fire each
        # window, as Celery's beat does, and say so.
        given["overlap"] = Overlap.ALLOW
    created = _runtime_call(ctx, add_schedule, schedule_id, remote_task=remote, **given)
    click.echo(f"added {_describe(created)}")
    if chosen:
        click.echo(
            "note: overlap=allow, as no live worker records cron runs (overlap=skip needs "
            f"them to see a run end); {recorders.HOW_TO_RECORD}, then `schedule update "
            f"{schedule_id} --overlap skip`",
            err=True,
        )
    elif not recorded:
        _warn_skip_unrecorded(created)


def _warn_skip_unrecorded(schedule: RuntimeSchedule) -> None:
    """One line when ``overlap=skip`` is asked for but no live worker records runs."""
    if schedule.overlap != Overlap.SKIP:
        return
    hold = schedule.timeout.total_seconds()
    click.echo(
        "warning: overlap=skip needs workers that record cron runs and none is live: each "
        f"run then holds the next windows for up to its time limit ({hold:g}s + grace); "
        f"{recorders.HOW_TO_RECORD}, or use --overlap allow",
        err=True,
    )


def _runs_recorded(ctx: click.Context) -> bool:
    """Whether a live worker records cron runs (:mod:`celery_app.cron_tasks.recorders`)."""
    settings = settings_of(load_app(ctx))
    client = get_redis(settings.redis_url, settings)
    return bool(recorders.live(client, state_keys(settings), time.time()))


@schedule.command(name="update")
@click.argument("schedule_id")
@_schedule_options
@click.pass_context
def update(ctx: click.Context, schedule_id: str, **fields: object) -> None:
    """Change fields of a runtime schedule (the others keep their values)."""
    given = _given(**fields)
    if not given:
        raise BadInput("nothing to update: give at least one option")
    remote = bool(fields["remote_task"])
    changed = _runtime_call(ctx, update_schedule, schedule_id, remote_task=remote, **given)
    click.echo(f"updated {_describe(changed)}")
    if not _runs_recorded(ctx):
        _warn_skip_unrecorded(changed)


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
    """Fire nothing of a task until ``resume``: a runtime schedule, a @cron task or a
    beat_schedule entry (kept in Redis; every beat sees it at its next tick)."""
    click.echo(f"paused {_runtime_call(ctx, pause_schedule, schedule_id).what}")


@schedule.command(name="resume")
@click.argument("schedule_id")
@click.pass_context
def resume(ctx: click.Context, schedule_id: str) -> None:
    """Fire a paused task again, from its next window."""
    click.echo(f"resumed {_runtime_call(ctx, resume_schedule, schedule_id).what}")
