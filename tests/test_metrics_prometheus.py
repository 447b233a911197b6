"""A running system scraped by a real Prometheus: the series move, the rules and the dashboard
name only series that exist, and an alert fires for a real failure.

The system: two beats (one fires each cron window, the other skips it as taken), a fast-lane
worker (threads), a shared worker and a cron-task worker (both prefork: their children's series
are summed by the parent), three checks against a local HTTP target and two cron tasks, one of
which fails. The beats run on an accelerated clock (a cron window every 2 s).

Needs Debian's ``prometheus`` package (``.ci/run`` installs it); skipped without it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.partitions import suite_keys
from support.polling import wait_for
from support.processes import Processes, http_status
from support.prometheus import PROMETHEUS, PROMTOOL, Prometheus, ScrapeJob, metric_names

from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import free_port
from celery_app.wall_clock import TEST_CLOCK_ENV, Clock

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None or PROMTOOL is None,
        reason="the prometheus binary is not installed (apt-get install prometheus; .ci/run does)",
    ),
]

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "checkbeat.json"
KEYS = suite_keys("cbtest")
TASKS = """
from celery_app import cron

@cron("* * * * *", id="m-ok", name="metrics.ok")
def ok():
    return "ok"

@cron("* * * * *", id="m-fail", name="metrics.fail")
def fail():
    raise RuntimeError("this cron task always fails")
"""
SETTINGS = {
    "CHECKBEAT_POOL_SIZE": "3",
    "CHECKBEAT_FAST_LANE_RESERVED": "1",
    "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "true",
    "CHECKBEAT_IMPORTS": "metrics_tasks",
    # the series counted below are the three checks' (cron tasks watched by heartbeat checks
    # would add theirs: tests/test_cron_monitor.py)
    "CHECKBEAT_CRON_MONITOR": "none",
}


def dashboard_exprs() -> str:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return "\n".join(t["expr"] for p in panels for t in p["targets"])


def test_prometheus_scrapes_every_process_and_sees_the_series_move(
    tmp_path, r, make_app, target, allow_private
):
    (tmp_path / "metrics_tasks.py").write_text(TASKS)
    clock = Clock(datetime.now(UTC), time.time(), 30.0)
    common = {**SETTINGS, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}:{tmp_path}"}
    ports = {name: free_port() for name in ("beat-a", "beat-b", "fast", "shared", "tasks")}
    procs = Processes(tmp_path)
    prometheus = None
    try:
        for beat in ("beat-a", "beat-b"):
            procs.celery(
                beat,
                "beat",
                "-l",
                "INFO",
                **common,
                CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports[beat]}",
                **{TEST_CLOCK_ENV: clock.encode()},
            )
        worker = ["worker", "--without-mingle", "--without-gossip", "-l", "INFO"]
        procs.celery(
            "fast",
            *worker,
            *("--role", "fast", "-P", "threads", "-n", "fast@metrics"),
            **common,
            CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['fast']}",
        )
        procs.celery(
            "shared",
            *worker,
            *("--role", "shared", "-P", "prefork", "-n", "shared@metrics"),
            **common,
            CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['shared']}",
        )
        procs.celery(
            "tasks",
            *worker,
            *("-Q", "celery", "-P", "prefork", "-c", "2", "-n", "tasks@metrics"),
            **common,
            CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['tasks']}",
        )
        for name, port in ports.items():
            wait_for(
                lambda port=port: http_status(f"http://127.0.0.1:{port}/healthz") == 200,
                60,
                interval=0.2,
                what=f"/healthz of {name}",
            )

        app = make_app(allow_private_targets=True)
        store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
        for uid, ms in (("quick", 20), ("medium", 80), ("third", 40)):
            store.create(
                uid=uid, tenant="t", kind="http", target=target.url(f"/delay/{ms}"), period=1
            )

        beats = [f"127.0.0.1:{ports[b]}" for b in ("beat-a", "beat-b")]
        workers = [f"127.0.0.1:{ports[w]}" for w in ("fast", "shared", "tasks")]
        prometheus = Prometheus(
            tmp_path,
            free_port(),
            [
                ScrapeJob("checkbeat-beat", beats),
                ScrapeJob("checkbeat-checks", beats[:1], "/metrics/checks", {"page": ["0"]}),
                ScrapeJob("checkbeat-workers", workers),
            ],
            ALERTS,
        )
        wait_for(
            lambda: prometheus.value("count(up == 1)") == 6, 30, interval=0.5, what="6 targets up"
        )

        moving = {
            "cron fired": "sum(checkbeat_cron_windows_fired_total)",
            "cron skipped as taken": 'sum(checkbeat_cron_windows_skipped_total{reason="taken"})',
            "cron runs ok": 'sum(checkbeat_cron_runs_total{outcome="success"})',
            "cron runs failed": 'sum(checkbeat_cron_runs_total{outcome="failure"})',
            "cron run durations": "sum(checkbeat_cron_run_duration_seconds_count)",
            "beat ticks": "sum(checkbeat_beat_tick_duration_seconds_count)",
            "dispatch promoted": "sum(checkbeat_dispatch_promoted_total)",
            "dispatch claimed": "sum(checkbeat_dispatch_claimed_total)",
            "dispatch published": "sum(checkbeat_dispatch_published_total)",
            "runs up": 'sum(checkbeat_check_runs_total{status="up"})',
            "start lateness": "sum(checkbeat_check_start_lateness_seconds_count)",
            "probe durations": "sum(checkbeat_check_probe_duration_seconds_count)",
        }
        first: dict[str, float] = {}
        for what, expr in moving.items():
            first[what] = wait_for(
                lambda expr=expr: (prometheus.value(expr) or 0) > 0 and prometheus.value(expr),
                60,
                interval=0.5,
                what=f"{what} ({expr}) above 0",
            )
        for what, expr in moving.items():
            wait_for(
                lambda expr=expr, what=what: (prometheus.value(expr) or 0) > first[what],
                60,
                interval=0.5,
                what=f"{what} ({expr}) to grow past {first[what]}",
            )
        # The 20-80 ms checks run in the fast lane, but for their first run: a check never
        # measured takes a shared slot (the slow lane), once each.
        assert prometheus.value('sum(checkbeat_check_runs_total{lane="fast"})') > 0
        assert prometheus.value('sum(checkbeat_check_runs_total{lane="slow"})') == 3
        # The scrape-time gauges and the per-check exporter.
        assert prometheus.value('checkbeat_region_workers{region="local"}') == 2
        assert prometheus.value("max(checkbeat_redis_up)") == 1
        assert prometheus.value('count(checkbeat_probe_lane{job="checkbeat-checks"})') == 3
        wait_for(
            lambda: prometheus.value("count(checkbeat_probe_success == 1)") == 3,
            30,
            interval=0.5,
            what="probe_success of the three checks",
        )
        # The failing cron task makes its alert fire; a region with workers does not alert.
        wait_for(
            lambda: (
                prometheus.value(
                    'count(ALERTS{alertname="CheckbeatCronRunsFailing",alertstate="firing",'
                    'task="m-fail"})'
                )
                == 1
            ),
            60,
            interval=0.5,
            what="the CheckbeatCronRunsFailing alert for m-fail",
        )
        assert prometheus.value('count(ALERTS{alertname="CheckbeatRegionWithoutWorkers"})') is None
        assert (
            prometheus.value('count(ALERTS{alertname="CheckbeatCronRunsFailing",task="m-ok"})')
            is None
        )

        scraped = prometheus.names()
        rules_names = metric_names(ALERTS.read_text())
        dash_names = metric_names(dashboard_exprs())
        assert len(rules_names) >= 8 and len(dash_names) >= 20
        assert rules_names - scraped == set()
        assert dash_names - scraped == set()
    finally:
        if prometheus is not None:
            prometheus.stop()
        procs.stop()


def test_promtool_accepts_the_alert_rules_and_the_scrape_config(tmp_path):
    import shutil
    import subprocess

    import yaml

    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rules = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
    assert f"SUCCESS: {rules} rules found" in done.stdout
    # The example scrape config for compose loads (and with it the rules file next to it), once
    # the token file its jobs name exists: promtool checks that it does.
    config = (ALERTS.parent / "prometheus.yml").read_text()
    token_path = "/etc/prometheus/checkbeat_metrics_token"
    assert config.count(f"credentials_file: {token_path}") == 3  # every job sends the token
    (tmp_path / "token").write_text("a-metrics-token\n")
    (tmp_path / "prometheus.yml").write_text(config.replace(token_path, str(tmp_path / "token")))
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
