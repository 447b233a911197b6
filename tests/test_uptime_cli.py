"""``checks report`` and ``uptime_report`` on the suite's redis-server, over transitions made by
the production post-exec write (``support.health.run_once``: a leased job finished through
``complete.lua``), and the refusals of bad input."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from support.health import run_once

from celery_app import uptime_report
from celery_app.errors import CheckFieldError
from celery_app.redis.schema import CheckStateField

DAY = 86400


def midnight(days_ago: int) -> float:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today - timedelta(days=days_ago)).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def add_check(cli, uid="web", tenant="acme"):
    cli(
        "add", uid, "--tenant", tenant, "--kind", "testprobe", "--target", "x", "--period", "30",
        "--regions", "eu,us", "--failure-threshold", "1", "--success-threshold", "1",
        "--quorum", "1",
    )  # fmt: skip


@pytest.fixture
def two_days(cli, r, keys, store):
    """``web``: first results at t0 (a midnight three days ago); eu down 01:00-01:30 on day 0,
    degraded 01:00-02:00 on day 1; us up throughout. Returns t0."""
    add_check(cli)
    t0 = midnight(3)
    s, p = store.settings, store.params
    made = [
        run_once(r, keys, s, p, "web@eu", True, t0)[1],
        run_once(r, keys, s, p, "web@us", True, t0 + 1)[1],
        run_once(r, keys, s, p, "web@eu", False, t0 + 3600)[1],
        run_once(r, keys, s, p, "web@eu", True, t0 + 5400)[1],
        run_once(r, keys, s, p, "web@eu", True, t0 + DAY + 3600, degraded="latency")[1],
        run_once(r, keys, s, p, "web@eu", True, t0 + DAY + 7200)[1],
    ]
    assert made == [None, None, "web#1", "web#2", "web#3", "web#4"]
    return t0


def test_a_report_by_day_from_real_transitions(cli, two_days):
    t0 = two_days
    out = cli("report", "web", "--from", iso(t0 - DAY), "--to", iso(t0 + 2 * DAY), "--by", "day",
              "--json")  # fmt: skip
    (report,) = json.loads(out)
    assert report["history_start"] == iso(t0)
    assert report["notes"] == []
    before, day0, day1 = report["buckets"]
    assert (before["no_data_s"], before["uptime_pct"], before["incidents"]) == (DAY, None, 0)
    assert (day0["up_s"], day0["down_s"], day0["no_data_s"]) == (DAY - 1800, 1800, 0)
    assert (day0["incidents"], day0["longest_incident_s"], day0["mttr_s"]) == (1, 1800, 1800)
    assert day0["uptime_pct"] == round(100 * (DAY - 1800) / DAY, 4)
    assert (day1["up_s"], day1["degraded_s"], day1["down_s"]) == (DAY - 3600, 3600, 0)
    assert (day1["uptime_pct"], day1["healthy_pct"]) == (100.0, round(100 * (DAY - 3600) / DAY, 4))
    total = report["total"]
    assert (total["no_data_s"], total["down_s"], total["degraded_s"], total["incidents"]) == (
        DAY,
        1800,
        3600,
        1,
    )
    text = cli("report", "web", "--from", iso(t0), "--to", iso(t0 + DAY))
    assert (
        f"web [acme] (history from {iso(t0)})" in text
        and "uptime   97.917%" in text
        and "incidents 1" in text
    )


def test_maintenance_is_shown_and_excluded_and_regions_are_reportable(cli, two_days):
    t0 = two_days
    # 00:30-01:15 every day: 15 minutes of the down period fall in it
    cli("maintenance", "add", "--check", "web", "--cron", "30 0 * * *", "--duration", "2700",
        "--timezone", "UTC")  # fmt: skip
    (day0,) = json.loads(cli("report", "web", "--from", iso(t0), "--to", iso(t0 + DAY), "--json"))
    total = day0["total"]
    assert (total["maintenance_s"], total["down_s"], total["up_s"]) == (2700, 900, DAY - 3600)
    assert (total["incidents"], total["longest_incident_s"], total["mttr_s"]) == (1, 900, 900)
    assert "maintenance windows are applied as defined now, over the whole range" in day0["notes"]
    # the region that stayed up; the one that went down is the check's own story
    both_days = ("report", "web", "--from", iso(t0), "--to", iso(t0 + 2 * DAY), "--json")
    (us,) = json.loads(cli(*both_days, "--region", "us"))
    assert (us["total"]["down_s"], us["total"]["degraded_s"], us["total"]["incidents"]) == (0, 0, 0)
    assert any("recorded only at the check's transitions" in n for n in us["notes"])
    (eu,) = json.loads(cli(*both_days, "--region", "eu"))
    # 15 minutes of day 1's degraded hour fall in that day's window
    assert (eu["total"]["down_s"], eu["total"]["degraded_s"]) == (900, 2700)


def test_tenant_csv_and_the_python_function_agree(cli, r, keys, store, dispatcher_app, two_days):
    t0 = two_days
    add_check(cli, "api")  # never ran: nothing known
    add_check(cli, "other", tenant="beta")
    out = cli("report", "--tenant", "acme", "--from", iso(t0), "--to", iso(t0 + 2 * DAY),
              "--by", "week", "--csv")  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {row["uid"] for row in rows} == {"api", "web"}
    api_total = next(row for row in rows if row["uid"] == "api" and row["period"] == "total")
    assert (float(api_total["no_data_s"]), api_total["uptime_pct"]) == (2 * DAY, "")
    reports = uptime_report(
        dispatcher_app, tenant="acme", start=iso(t0), end=iso(t0 + 2 * DAY), by="week"
    )
    assert [r.uid for r in reports] == ["api", "web"]
    web = next(row for row in rows if row["uid"] == "web" and row["period"] == "total")
    assert float(web["down_s"]) == reports[1].total.totals.down == 1800
    assert reports[0].notes == ["no result recorded yet"]


def test_a_trimmed_stream_says_where_history_starts(cli, r, keys, store):
    add_check(cli)
    s = store.settings.model_copy(update={"transitions_history": 2})
    t0 = midnight(2)
    for i, ok in enumerate([True, False, True, False, True]):
        run_once(r, keys, s, store.params, "web@eu", ok, t0 + i * 600)
    (report,) = json.loads(cli("report", "web", "--from", iso(t0), "--to", iso(t0 + DAY), "--json"))
    # #3 (down at t0+1800) and #4 (up at t0+2400) are kept: before #3 nothing is known
    assert report["history_start"] == iso(t0 + 1800)
    assert report["total"]["no_data_s"] == 1800
    assert report["total"]["down_s"] == 600
    assert any(n.startswith(f"history starts at {iso(t0 + 1800)}") for n in report["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["web", "--from", "yesterday", "--to", "2026-01-02"], "from: 'yesterday' is not an ISO"),
        (["web", "--from", "2026-01-02", "--to", "2026-01-01"], "to: must be after --from"),
        (["web", "--from", "2024-01-01", "--to", "2026-01-01"], "to: the range may span at most"),
        (["web", "--from", "2026-01-01", "--to", "2026-01-02", "--by", "year"],
         "by: 'year' is not allowed: use day|week|month"),
        (["web", "--from", "2026-01-01", "--to", "2026-01-02", "--timezone", "Mars/Base"],
         "timezone: unknown timezone 'Mars/Base'"),
        (["--from", "2026-01-01", "--to", "2026-01-02"], "uid: give exactly one of"),
        (["web", "--tenant", "acme", "--from", "2026-01-01", "--to", "2026-01-02"],
         "uid: give exactly one of"),
        (["web", "--from", "2026-01-01", "--to", "2026-01-02", "--json", "--csv"],
         "--csv: give one of --json and --csv"),
        (["web", "--to", "2026-01-02"], "Missing option '--from'"),
        (["web", "--from", "2026-01-01", "--to", "2026-01-02", "--region", "e u"],
         "region: 'e u' is not allowed"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(cli, r, args, message):
    add_check(cli)
    before = sorted(r.keys("*"))
    out = cli("report", *args, ok=False)
    assert cli.exit_code == 2, out
    assert message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert sorted(r.keys("*")) == before


def test_an_unknown_check_is_refused(cli, dispatcher_app):
    out = cli("report", "nope", "--from", "2026-01-01", "--to", "2026-01-02", ok=False)
    assert cli.exit_code == 1 and "no check with uid 'nope'" in out
    with pytest.raises(CheckFieldError, match="by: 'hour' is not allowed"):
        uptime_report(dispatcher_app, "nope", start="2026-01-01", end="2026-01-02", by="hour")


def test_the_current_state_counts_until_now_then_no_data(cli, r, keys, store):
    add_check(cli)
    now = time.time()
    run_once(r, keys, store.settings, store.params, "web@eu", False, now - 600)
    (report,) = json.loads(
        cli("report", "web", "--from", iso(now - 1200), "--to", iso(now + 3600), "--json")
    )
    total = report["total"]
    assert 590 <= total["down_s"] <= 700  # until the report's now
    assert total["incidents"] == 1 and total["mttr_s"] is None  # not recovered
    assert total["no_data_s"] + total["down_s"] == pytest.approx(4800, abs=0.01)


def test_a_check_older_than_its_first_result_record_starts_at_its_oldest_evidence(
    cli, r, keys, store
):
    add_check(cli)
    t0 = midnight(2)
    run_once(r, keys, store.settings, store.params, "web@eu", True, t0)
    run_once(r, keys, store.settings, store.params, "web@eu", False, t0 + 600)
    # as a store written before FIRST existed: it was set at the first state change after
    r.hset(keys.check_state("web"), CheckStateField.FIRST, f"{t0 + 600:.3f}")
    cli("disable", "web")
    (report,) = json.loads(cli("report", "web", "--from", iso(t0), "--to", iso(t0 + DAY), "--json"))
    assert report["history_start"] == iso(t0)  # the oldest kept result
    assert report["total"]["up_s"] == 600 and report["total"]["no_data_s"] == 0
    notes = report["notes"]
    assert any(
        n.startswith(f"history starts at {iso(t0)}: the check's first result") for n in notes
    )
    assert any(n.startswith("the check is disabled now") for n in notes)


def test_a_tenant_report_reads_every_partition(r, redis_url, broker_url, test_kind):
    from celery_app.checks.layout import ensure_layout
    from celery_app.checks.maintenance import MaintenanceStore, validate_window
    from celery_app.checks.store import CheckStore
    from celery_app.checks.uptime import uptime_reports
    from celery_app.redis.keyspace import state_keys
    from celery_app.settings import load_settings
    from scheduling_core import Params

    settings = load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=["eu"],
        check_partitions=4,
    )  # fmt: skip
    keys = state_keys(settings)
    ensure_layout(r, keys)
    store = CheckStore(r, keys, settings)
    uids = [f"p{i}" for i in range(8)]
    for uid in uids:
        store.create(uid=uid, tenant="acme", kind=test_kind, target="x", period=60,
                     regions=["eu"], failure_threshold=1, success_threshold=1)  # fmt: skip
    assert len({keys.of_check(uid).partition for uid in uids}) > 1
    window = validate_window(tenant="acme", cron="0 12 * * *", duration=600, timezone="UTC")
    MaintenanceStore(r, keys).add(window)
    t0, params = midnight(2), Params.from_settings(settings)
    for i, uid in enumerate(uids):  # check i is down for i minutes from 06:00
        run_once(r, keys, settings, params, f"{uid}@eu", True, t0)
        if i:
            run_once(r, keys, settings, params, f"{uid}@eu", False, t0 + 6 * 3600)
            run_once(r, keys, settings, params, f"{uid}@eu", True, t0 + 6 * 3600 + 60 * i)
    reports = uptime_reports(r, keys, store.uids("acme"), t0, t0 + DAY, now=t0 + DAY)
    assert [rep.uid for rep in reports] == uids
    assert [rep.total.totals.down for rep in reports] == [60.0 * i for i in range(8)]
    assert {rep.total.totals.maintenance for rep in reports} == {600.0}
    assert all(rep.history_start == t0 for rep in reports)
    # a reader given another partition count is refused, naming the setting
    from celery_app.checks.layout import PartitionLayoutError
    from celery_app.factory import create_app

    one = create_app(settings.model_copy(update={"check_partitions": 1}))
    try:
        with pytest.raises(PartitionLayoutError, match="CHECKBEAT_CHECK_PARTITIONS=1"):
            uptime_report(one, tenant="acme", start=iso(t0), end=iso(t0 + DAY))
    finally:
        one.close()
