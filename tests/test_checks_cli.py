"""``celery -A celery_app checks ...`` against a real Redis."""

from __future__ import annotations

import json

from celery.bin.celery import celery as celery_main
from click.testing import CliRunner
from support.checks import at, learned

from celery_app.cli.checks import checks
from celery_app.redis.schema import JobField


def test_add_list_show_update_rm(cli, r, keys, store):
    out = cli(
        "add",
        "web1",
        "--tenant",
        "acme",
        "--kind",
        "testprobe",
        "--target",
        "https://x",
        "--period",
        "30",
        "--regions",
        "eu,us",
        "--plan-weight",
        "2",
        "--config",
        '{"timeout": 3}',
    )
    assert "added web1" in out
    listed = json.loads(cli("list", "--json"))
    assert [c["uid"] for c in listed] == ["web1"]
    assert listed[0]["config"] == {"timeout": 3} and listed[0]["regions"] == ["eu", "us"]
    assert "web1" in cli("list", "--tenant", "acme")
    learned(r, keys, store.params, "web1@eu", scheduled_at=1_780_000_000.0, cost_ms=1200.0, lane=1)
    shown = json.loads(cli("show", "web1", "--json"))
    eu = next(j for j in shown["jobs"] if j["region"] == "eu")
    assert eu["lane"] == "slow" and eu["cost_ewma_ms"] == 1200.0
    assert eu["scheduled_at"].startswith("2026-05-28T")
    assert "effective_scheduled_at" in cli("show", "web1")
    cli("update", "web1", "--period", "60", "--regions", "eu")
    assert json.loads(cli("show", "web1", "--json"))["jobs"][0]["cost_ewma_ms"] == 1200.0
    assert "deleted web1" in cli("rm", "web1")
    assert json.loads(cli("list", "--json")) == []


def test_bad_input_names_the_field_and_writes_nothing(cli, r):
    add = ("add", "x", "--tenant", "acme", "--kind", "testprobe", "--target", "t", "--period", "10")
    out = cli(*add, "--region-spread", "10", ok=False)
    assert "region_spread:" in out and "< period (10)" in out
    out = cli(*add, "--config", '{"timeout": 0}', ok=False)
    assert "config.timeout:" in out
    assert r.dbsize() == 0
    assert "no check with uid 'nope'" in cli("rm", "nope", ok=False)


def test_costs_report_per_lane(cli, r, keys, store):
    for i, cost in enumerate([10.0, 20.0, 30.0, 2000.0]):
        store.create(
            now=at(1_780_000_000),
            uid=f"c{i}",
            tenant="acme",
            kind="testprobe",
            target="x",
            period=60,
        )
        learned(
            r,
            keys,
            store.params,
            f"c{i}@eu",
            scheduled_at=1_780_000_000.0,
            cost_ms=cost,
            lane=1 if cost > 1000 else 0,
        )
    report = {lane["lane"]: lane for lane in json.loads(cli("costs", "--json"))}
    assert report["fast"]["cost"]["count"] == 3 and report["fast"]["cost"]["max"] == 30.0
    assert report["fast"]["cost"]["p50"] == 20.0
    assert report["slow"]["buckets"]["1000-5000 ms"] == 1
    assert report["fast"]["buckets"]["< 100 ms"] == 3
    assert "lane slow: 1 job(s)" in cli("costs")


def test_ratelimit_set_show_off(cli, r, keys):
    assert "acme: 20/min, burst 5" in cli("ratelimit", "acme", "--per-minute", "20", "--burst", "5")
    assert "acme: 20/min, burst 5" in cli("ratelimit", "acme")
    assert "per_minute:" in cli("ratelimit", "acme", "--per-minute", "-1", ok=False)
    assert "removed" in cli("ratelimit", "acme", "--off")
    assert "no rate limit" in cli("ratelimit", "acme")


def test_diagnose_reports_regions_without_workers(cli):
    out = cli("diagnose", ok=False)  # exit 1: it reports a problem
    assert "PROBLEM: region eu: no live worker" in out


def test_reachable_as_a_celery_subcommand(r, test_kind, settings, monkeypatch):
    """As ``celery -A celery_app checks``: the entry point when installed, else added here."""
    if "checks" not in celery_main.commands:
        celery_main.add_command(checks)
    runner = CliRunner()
    result = runner.invoke(
        celery_main, ["-A", "celery_app", "checks", "list", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == []


def test_show_costs_and_status_report_a_torn_job_instead_of_failing(
    cli, r, keys, store, dispatcher_app
):
    from celery_app.local.status import collect_status

    for uid in ("torn", "fine"):
        store.create(
            now=at(1_780_000_000), uid=uid, tenant="acme", kind="testprobe", target="x", period=60
        )
    r.hset(keys.job("torn@eu"), JobField.RUNS, "lots")  # not a number: JobState cannot decode it

    shown = json.loads(cli("show", "torn", "--json"))
    assert shown["jobs"] == [
        {"job": "torn@eu", "region": "eu", "unreadable": shown["jobs"][0]["unreadable"]}
    ]
    assert "ValueError" in shown["jobs"][0]["unreadable"]
    assert "unreadable job" in cli("show", "torn")
    assert json.loads(cli("show", "fine", "--json"))["jobs"][0]["runs"] == 0

    costs = CliRunner().invoke(checks, ["costs", "--json"], obj=cli.obj)
    assert costs.exit_code == 0, costs.output
    report = {lane["lane"]: lane for lane in json.loads(costs.stdout)}  # stderr kept apart
    assert report["fast"]["cost"]["count"] + report["slow"]["cost"]["count"] == 1  # "fine"
    assert "left out, unreadable: torn@eu" in costs.stderr

    rows = collect_status(dispatcher_app)["checks"]
    assert [row["uid"] for row in rows] == ["fine"]
