"""``checks report``: uptime, downtime, degraded time, incidents and time with no data of a check
or a tenant's checks over a range (``checks/uptime.py``; the method: docs/reports.md)."""

from __future__ import annotations

import csv
import json
import sys

import click

from celery_app.checks.layout import PartitionLayoutError
from celery_app.checks.uptime import (
    CheckReport,
    Period,
    duration_text,
    report_rows,
    uptime_report,
)
from celery_app.cli.common import BadInput, CheckbeatCommand, load_app
from celery_app.cli.terminal import escape
from celery_app.errors import CheckFieldError, CheckNotFound


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}%"


def _line(label: str, p: Period) -> str:
    d = p.as_dict()
    return (
        f"{label:25} uptime {_pct(d['uptime_pct']):>9} (healthy {_pct(d['healthy_pct'])})  "
        f"down {duration_text(d['down_s'])}  degraded {duration_text(d['degraded_s'])}  "
        f"maintenance {duration_text(d['maintenance_s'])}  no data {duration_text(d['no_data_s'])}"
        f"  incidents {d['incidents']} (longest {duration_text(d['longest_incident_s'])}, "
        f"MTTR {duration_text(d['mttr_s'])})"
    )


def _echo(report: CheckReport) -> None:
    region = f" region {escape(report.region)}" if report.region else ""
    since = report.as_dict()["history_start"] or "none"
    click.echo(f"{escape(report.uid)} [{escape(report.tenant)}]{region} (history from {since})")
    click.echo(_line("total", report.total))
    for p in report.buckets:
        click.echo(_line(f"  {p.as_dict()['from']}", p))
    for note in report.notes:
        click.echo(f"  note: {escape(note)}")


@click.command("report", cls=CheckbeatCommand)
@click.argument("uid", required=False)
@click.option("--tenant", help="Report every check of this tenant.")
@click.option("--from", "start", required=True, help="Start, ISO 8601 (no offset: UTC).")
@click.option("--to", "end", required=True, help="End (excluded), ISO 8601 (no offset: UTC).")
@click.option("--by", help="Also one row per day, week or month: day|week|month.")
@click.option("--timezone", help="IANA timezone the --by buckets are cut in (default UTC).")
@click.option("--region", help="This region's states instead of the check's quorum state.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV row per check and period.")
@click.pass_context
def report(
    ctx: click.Context,
    uid: str | None,
    tenant: str | None,
    start: str,
    end: str,
    by: str | None,
    timezone: str | None,
    region: str | None,
    as_json: bool,
    as_csv: bool,
) -> None:
    """Uptime report of check UID or of every check of a --tenant over [--from, --to)."""
    if as_json and as_csv:
        raise BadInput("--csv: give one of --json and --csv")
    app = load_app(ctx)
    try:
        reports = uptime_report(
            app,
            uid,
            tenant=tenant,
            start=start,
            end=end,
            by=by,
            region=region,
            timezone=timezone,
        )
    except (CheckFieldError, PartitionLayoutError) as exc:
        raise BadInput(str(exc)) from None
    except CheckNotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    if as_csv:
        rows = report_rows(reports)
        fields = list(rows[0]) if rows else ["uid", "tenant", "region", "period"]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    if not reports:
        click.echo("no checks")
    for r in reports:
        _echo(r)
