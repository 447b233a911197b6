"""``checks maintenance add|rm|list``, ``checks transitions`` and the state in ``checks show``,
against the suite's redis-server."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from support.health import run_once


def add_check(cli, uid="web", *extra, ok=True):
    return cli(
        "add", uid, "--tenant", "acme", "--kind", "testprobe", "--target", "x",
        "--period", "30", "--regions", "eu,us", *extra, ok=ok,
    )  # fmt: skip


def test_thresholds_from_the_command_line_and_refused_values(cli, r, keys):
    add_check(cli, "web", "--failure-threshold", "4", "--success-threshold", "1", "--quorum", "1")
    shown = json.loads(cli("show", "web", "--json"))
    assert shown["check"]["failure_threshold"] == 4 and shown["check"]["quorum"] == 1
    assert shown["state"]["state"] == "up" and shown["state"]["regions"] == {"eu": "up", "us": "up"}
    out = add_check(cli, "bad", "--quorum", "3", ok=False)
    assert "quorum: must be an integer >= 1 and <= 2" in out
    assert not r.exists(keys.check("bad"))
    cli("update", "web", "--failure-threshold", "0", ok=False)
    assert json.loads(cli("show", "web", "--json"))["check"]["failure_threshold"] == 4
    cli("update", "web", "--default-state-rules")
    check = json.loads(cli("show", "web", "--json"))["check"]
    assert (check["failure_threshold"], check["success_threshold"], check["quorum"]) == (
        None,
        None,
        None,
    )


def test_maintenance_add_list_show_rm(cli, r, keys):
    add_check(cli)
    out = cli(
        "maintenance", "add", "--check", "web", "--cron", "0 3 * * sun", "--duration", "7200",
        "--timezone", "Europe/Berlin", "--id", "weekly",
    )  # fmt: skip
    assert "added window weekly to check:web" in out and "next start 20" in out
    cli("maintenance", "add", "--tenant", "acme", "--cron", "30 1 1 * *", "--duration", "600",
        "--timezone", "UTC", "--id", "monthly")  # fmt: skip
    rows = json.loads(cli("maintenance", "list", "--json"))
    assert {w["id"]: w["scope"] for w in rows} == {"weekly": "check:web", "monthly": "tenant:acme"}
    assert [
        w["id"] for w in json.loads(cli("maintenance", "list", "--check", "web", "--json"))
    ] == ["weekly"]
    shown = json.loads(cli("show", "web", "--json"))
    m = shown["maintenance"]
    assert {w["id"] for w in m["windows"]} == {"weekly", "monthly"}
    start = datetime.fromisoformat(m["next_start"])
    assert start > datetime.now(UTC)
    # the next start is the earlier of the check's and the tenant's next windows
    local = start.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (local.weekday(), local.hour, local.minute) == (6, 3, 0) or (
        start.day,
        start.hour,
        start.minute,
    ) == (1, 1, 30)
    assert "next window" in cli("show", "web")
    cli("maintenance", "rm", "weekly")
    cli("maintenance", "rm", "weekly", ok=False)
    assert [w["id"] for w in json.loads(cli("maintenance", "list", "--json"))] == ["monthly"]


def test_a_deleted_checks_windows_go_with_it_and_its_tenants_stay(cli, r, keys):
    add_check(cli)
    cli("maintenance", "add", "--check", "web", "--cron", "0 3 * * *", "--duration", "600",
        "--id", "own")  # fmt: skip
    cli("maintenance", "add", "--tenant", "acme", "--cron", "0 4 * * *", "--duration", "600",
        "--id", "shared")  # fmt: skip
    version = r.get(keys.maintenance_version())
    cli("rm", "web")
    assert [w["id"] for w in json.loads(cli("maintenance", "list", "--json"))] == ["shared"]
    assert not r.exists(keys.maintenance("check:web"))
    assert not r.sismember(keys.maintenance_scopes(), "check:web")
    assert r.get(keys.maintenance_version()) != version  # workers' cached windows are re-read
    add_check(cli)  # the same uid again: it inherits nothing
    windows = json.loads(cli("show", "web", "--json"))["maintenance"]["windows"]
    assert [w["id"] for w in windows] == ["shared"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--check", "web", "--cron", "0 3 * * funday", "--duration", "60"], "cron"),
        (["--check", "web", "--cron", "0 3 * * *", "--duration", "10"], "duration"),
        (["--check", "web", "--cron", "0 3 * * *", "--duration", "60", "--timezone", "X/Y"],
         "timezone"),
        (["--check", "nope", "--cron", "0 3 * * *", "--duration", "60"], "no check"),
        (["--cron", "0 3 * * *", "--duration", "60"], "scope"),
    ],
)  # fmt: skip
def test_bad_windows_are_refused_and_nothing_is_written(cli, r, keys, args, message):
    add_check(cli)
    out = cli("maintenance", "add", *args, ok=False)
    assert message in out
    assert r.scard(keys.maintenance_scopes()) == 0


def test_transitions_are_listed_per_check_and_tenant(cli, r, keys, store):
    add_check(cli, "web", "--failure-threshold", "1", "--quorum", "1")
    now = time.time()
    run_once(r, keys, store.settings, store.params, "web@eu", False, now)
    rows = json.loads(cli("transitions", "web", "--json"))
    assert [(t["id"], t["to"]) for t in rows] == [("web#1", "down")]
    assert json.loads(cli("transitions", "--tenant", "acme", "--json")) == rows
    assert "up -> down" in cli("transitions", "web")
    shown = cli("show", "web")
    assert "state          down" in shown and "eu=down" in shown
