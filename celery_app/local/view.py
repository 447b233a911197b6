"""Render the status data as terminal tables (rich) for `checkbeat up` and `checkbeat status`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

MAX_CHECK_ROWS = 40


def _ms(value: Any) -> str:
    return "-" if value in (None, "") else f"{float(value):.0f}"


def _s(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _time(value: str | None) -> str:
    return value[11:19] if value else "-"


def lanes_table(data: dict[str, Any]) -> Table:
    table = Table(title="lanes", title_justify="left")
    columns = ("region", "lane", "running", "queued (broker)", "waiting (redis, WFQ)")
    for column in (*columns, "start late p50 / p99 s"):
        table.add_column(column)
    lateness = data.get("lateness") or {}
    for lane in data["lanes"]:
        late = lateness.get(f"{lane['region']}/{lane['lane']}") or {}
        table.add_row(
            lane["region"],
            lane["lane"],
            str(lane["running"]),
            str(lane["queued"]),
            str(lane["waiting"]),
            f"{_s(late.get('p50'))} / {_s(late.get('p99'))}",
        )
    return table


def checks_table(data: dict[str, Any]) -> Table:
    checks = data["checks"]
    title = f"checks ({len(checks)} jobs)"
    if len(checks) > MAX_CHECK_ROWS:
        title += f", first {MAX_CHECK_ROWS}"
    table = Table(title=title, title_justify="left")
    for column in (
        "check",
        "tenant",
        "region",
        "lane",
        "cost ms",
        "delay ms",
        "runs",
        "state",
        "last",
        "latency ms",
        "next run",
    ):
        table.add_column(column)
    for row in checks[:MAX_CHECK_ROWS]:
        status = row["last_status"] or "-"
        if row["last_error"]:
            status = f"{status} ({row['last_error']})"
        style = "green" if row["last_status"] == "up" else ("red" if row["last_status"] else None)
        table.add_row(
            row["uid"],
            row["tenant"],
            row["region"],
            f"[yellow]{row['lane']}[/]" if row["lane"] == "slow" else row["lane"],
            _ms(row["cost_ewma_ms"]),
            _ms(row["delay_ewma_ms"]),
            str(row["runs"]),
            _state(row.get("region_state", "up")),
            f"[{style}]{status}[/]" if style else status,
            _ms(row["last_latency_ms"]),
            "running" if row["running"] else _time(row["next_run"]),
        )
    return table


def cron_table(data: dict[str, Any]) -> Table:
    table = Table(title="cron tasks", title_justify="left")
    for column in ("task", "spec", "scope", "next", "last run", "outcome", "fired", "skipped"):
        table.add_column(column)
    for row in data["cron"]:
        table.add_row(
            row["id"],
            row["spec"],
            row["scope"],
            row.get("next_fire") or "never",
            row.get("last_end") or row.get("last_start") or "-",
            row.get("last_outcome") or "-",
            str(row.get("fired", 0)),
            str(row.get("skipped", 0)),
        )
    return table


def metrics_table(data: dict[str, Any]) -> Table:
    table = Table(title="metrics endpoints", title_justify="left")
    for column in ("process", "role", "metrics", "health"):
        table.add_column(column)
    for row in data.get("metrics") or []:
        table.add_row(row["name"], row["role"], row["metrics"], row["healthz"])
    return table


STATE_STYLE = {"up": "green", "degraded": "yellow", "down": "red"}


def _state(value: str) -> str:
    style = STATE_STYLE.get(value)
    return f"[{style}]{value}[/]" if style else value


def states_table(data: dict[str, Any]) -> Table:
    """Checks that are not up (or held by maintenance), then the newest transitions."""
    states = data.get("states", [])
    bad = [s for s in states if s["state"] != "up" or s["observed"] != s["state"]]
    undelivered = data.get("undelivered", 0)
    title = f"state: {len(states) - len(bad)} of {len(states)} checks up"
    if undelivered:
        title += f", {undelivered} transition(s) not delivered yet"
    table = Table(title=title, title_justify="left")
    for column in ("when", "check", "tenant", "transition", "note"):
        table.add_column(column)
    for s in bad:
        note = f"held until {_time(s['held_until'])}" if s["held_until"] else "now"
        table.add_row(_time(s["since"]), s["uid"], s["tenant"], _state(s["state"]), note)
    for t in data.get("transitions", []):
        table.add_row(
            _time(t["at"]),
            t["uid"],
            t["tenant"],
            f"{_state(t['from'])} -> {_state(t['to'])}",
            "after maintenance" if t["held"] else "",
        )
    return table


def render(data: dict[str, Any]) -> Group:
    return Group(
        lanes_table(data),
        checks_table(data),
        states_table(data),
        cron_table(data),
        metrics_table(data),
    )
