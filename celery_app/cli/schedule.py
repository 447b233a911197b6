"""``celery -A celery_app schedule list|run|diagnose``: cron tasks from any machine.

``diagnose`` exits 1 when it reports anything, so it can serve as a health probe; every command
exits 2 with one line when it cannot run (Redis unreachable, bad settings: ``cli.common``).
"""

from __future__ import annotations

import json

import click
from celery.bin.base import handle_preload_options

from celery_app.cli.common import EXIT_PROBLEM, CheckbeatGroup, load_app
from celery_app.cli.terminal import escape
from celery_app.cron_tasks.service import CronService, CronUsageError, row_dict


def _service(ctx: click.Context) -> CronService:
    return CronService(load_app(ctx))


@click.group(name="schedule", cls=CheckbeatGroup)
@click.pass_context
@handle_preload_options
def schedule(ctx: click.Context) -> None:
    """Cron tasks: list them, run one now, diagnose what is overdue or failing."""


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every cron task: spec, timezone, scope, next fire, last run and outcome."""
    rows = _service(ctx).rows()
    if as_json:
        click.echo(json.dumps([row_dict(r) for r in rows], indent=2))
        return
    header = ("ID", "SPEC", "TZ", "SCOPE", "SINGLETON", "TIMEOUT", "NEXT", "LAST RUN", "OUTCOME")
    table = [header]
    for r in rows:
        outcome = r.last_outcome or "-"
        if r.last_error and outcome != "success":
            outcome = f"{outcome}: {r.last_error}"
        table.append(
            (
                r.id,
                r.spec,
                r.timezone,
                r.scope,
                "yes" if r.singleton else "no",
                f"{r.timeout_s:g}s",
                r.next_fire or "never",
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
        outcome = state.get("outcome", "unknown")
        if outcome == "success":
            click.echo("outcome: success")
            return
        click.echo(escape(f"outcome: {outcome}: {state.get('last_error', '')}".rstrip(": ")))
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
