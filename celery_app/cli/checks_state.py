"""``checks maintenance add|rm|list`` (``rm`` and ``list`` as ``checks notify``'s: ``scoped.py``),
``checks transitions`` (with each transition's notification outcomes), and the state part of
``checks show`` (the state, the regions' states, the open or next maintenance window)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import click

from celery_app.checks.check_state import CheckHealth, read_tenant_transitions, read_transitions
from celery_app.checks.check_state import read_check_health as _read_health
from celery_app.checks.definition import CheckDefinition
from celery_app.checks.maintenance import (
    MaintenanceStore,
    Window,
    next_start,
    open_until,
    validate_window,
)
from celery_app.checks.notify import outcomes_of
from celery_app.checks.store import CheckStore
from celery_app.cli.common import (
    MAX_LISTED,
    CheckbeatCommand,
    CheckbeatGroup,
    check_store,
    echo_rows,
)
from celery_app.cli.scoped import add_scoped, scope_options, scoped_commands
from celery_app.cli.terminal import escape


def _iso(value: datetime | float | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).isoformat(timespec="seconds")


def read_check_health(store: CheckStore, uid: str) -> CheckHealth:
    defn = store.require(uid).definition
    return _read_health(store.redis, store.keys, uid, defn.regions)


def maintenance_summary(store: CheckStore, defn: CheckDefinition) -> dict[str, Any]:
    """The windows that apply to a check, whether one is open, and when the next starts."""
    windows = MaintenanceStore(store.redis, store.keys).for_check(defn.uid, defn.tenant)
    now = datetime.now(UTC)
    until = open_until(windows, now)
    upcoming = next_start(windows, now)
    return {
        "windows": [w.as_dict() for w in windows],
        "open_until": _iso(until),
        "next_start": _iso(upcoming[0]) if upcoming else None,
        "next_window": upcoming[1].id if upcoming else None,
    }


def echo_state(data: dict[str, Any]) -> None:
    """The state lines of ``checks show``."""
    state = data["state"]
    regions = " ".join(f"{escape(r)}={s}" for r, s in state["regions"].items())
    click.echo(
        f"{'state':14} {state['state']} (since {_iso(state['since']) or 'created'}) {regions}"
    )
    if state["observed"] != state["state"]:
        click.echo(f"{'held':14} {state['observed']} until {_iso(state['held_until'])}")
    m = data["maintenance"]
    if m["open_until"]:
        click.echo(f"{'maintenance':14} open until {m['open_until']}")
    if m["next_start"]:
        click.echo(f"{'next window':14} {m['next_start']} ({escape(m['next_window'])})")
    elif not m["windows"]:
        click.echo(f"{'next window':14} none")
    for target in data.get("notify", []):
        click.echo(f"{'notify':14} {escape(target['url'])} ({escape(target['scope'])})")
    for t in data["transitions"][:5]:
        click.echo(f"{'transition':14} {_iso(t['at'])} {t['from']} -> {t['to']} ({t['id']})")


@click.group(name="maintenance", cls=CheckbeatGroup)
def maintenance() -> None:
    """Maintenance windows: checks keep running, transitions wait for the window's end."""


@maintenance.command("add")
@scope_options("The check the window applies to.", "The tenant whose checks the window applies to.")
@click.option("--cron", required=True, help="When windows start, e.g. '0 3 * * sun'.")
@click.option("--duration", required=True, help="Seconds each window lasts (60 to 604800).")
@click.option("--timezone", help="IANA timezone of the cron spec (default: CHECKBEAT_TIMEZONE).")
@click.option("--id", "window_id", help="The window's id (default: generated).")
@click.pass_context
def add(
    ctx: click.Context,
    uid: str | None,
    tenant: str | None,
    cron: str,
    duration: str,
    timezone: str | None,
    window_id: str | None,
) -> None:
    """Add a window to a check (--check) or to all of a tenant's checks (--tenant)."""
    store = check_store(ctx)
    window = add_scoped(
        MaintenanceStore(store.redis, store.keys),
        lambda: validate_window(
            uid=uid,
            tenant=tenant,
            cron=cron,
            duration=duration,
            timezone=timezone or store.settings.timezone,
            window_id=window_id,
        ),
    )
    upcoming = window.next_start(datetime.now(UTC))
    click.echo(
        f"added window {window.id} to {escape(window.scope)}: {escape(window.cron)} "
        f"({window.timezone}) for {window.duration_s}s; next start {_iso(upcoming)}"
    )


def _window_rows(windows: list[Window]) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        w.as_dict()
        | {"open_until": _iso(w.end_if_open(now)), "next_start": _iso(w.next_start(now))}
        for w in windows
    ]


def _window_line(w: dict[str, Any]) -> str:
    opened = f" (open until {w['open_until']})" if w["open_until"] else ""
    return (
        f"{escape(w['id']):12} {escape(w['scope']):28} {escape(w['cron']):18} "
        f"{w['timezone']:16} {w['duration_s']:>8}  {w['next_start']}{opened}"
    )


scoped_commands(
    maintenance,
    MaintenanceStore,
    noun="maintenance window",
    short="window",
    list_help="List maintenance windows with their next start.",
    rows=_window_rows,
    header=f"{'ID':12} {'SCOPE':28} {'CRON':18} {'TZ':16} {'SECONDS':>8}  NEXT START",
    line=_window_line,
)


@click.command("transitions", cls=CheckbeatCommand)
@click.argument("uid", required=False)
@click.option("--tenant", help="The tenant's transitions (all its checks).")
@click.option(
    "--count",
    type=click.IntRange(1, MAX_LISTED),
    default=20,
    show_default=True,
    help="How many, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def transitions(
    ctx: click.Context, uid: str | None, tenant: str | None, count: int, as_json: bool
) -> None:
    """Recent transitions of check UID or of a --tenant."""
    if (uid is None) == (tenant is None):
        raise click.UsageError("give a check UID or --tenant")
    store = check_store(ctx)
    if uid:
        rows = read_transitions(store.redis, store.keys.check_transitions(uid), count=count)
    else:
        rows = read_tenant_transitions(store.redis, store.keys, tenant or "", count=count)
    sent = outcomes_of(store.redis, store.keys, [t["id"] for t in rows])
    for t, outcomes in zip(rows, sent, strict=True):
        t["notifications"] = [o.as_dict() for o in outcomes]
    now = time.time()
    echo_rows(rows, as_json, none="no transitions", line=lambda t: _transition_lines(t, now))


def _transition_lines(t: dict[str, Any], now: float) -> str:
    """A transition's line, then one line for each of its notification outcomes."""
    held = " held by maintenance" if t.get("held") else ""
    ago = f"{now - float(t['at']):.0f}s ago"
    lines = [
        f"{_iso(t['at'])} ({ago}) {escape(t['uid'])} {t['from']} -> {t['to']}{held} ({t['id']})"
    ]
    for o in t["notifications"]:
        verdict = "sent" if o["ok"] else f"FAILED: {o.get('error', '')}"
        lines.append(
            f"    notify {escape(o['target'])} {verdict} at {_iso(o['at'])} "
            f"(attempts {o['attempts']})"
        )
    return "\n".join(lines)
