"""The broker refuses connections for a while (its redis-server is stopped, then started again
on the same port): beat keeps running without spinning, fires nothing twice when the broker
returns, and ``schedule diagnose`` names the windows that could not be sent.

State stays on the session Redis; the broker is a separate redis-server (AOF on, as a broker
should be). Beat runs on the test clock at RATE x, so the outage spans several cron windows.
The default run uses a 15 s outage; the 60 s variant is marked slow.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis
from fault_procs import Processes, ahead_clock, clocked_env
from support.partitions import suite_keys
from support.polling import wait_for
from support.run_witness import recorded_runs, run_counts

from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.registration import GLOBAL_TENANT, window_id, window_start
from celery_app.cron_tasks.service import CronService
from celery_app.factory import create_app
from celery_app.findings import FindingKind
from celery_app.local.embedded_redis import RedisServer
from celery_app.settings import load_settings

pytestmark = pytest.mark.faults

KEYS = suite_keys("cbtest")
HERE = Path(__file__).resolve().parent
RATE = 10.0  # one window = 6 real seconds
TASKS = 3
QUEUES = "celery,checks.local.fast,checks.local.slow"
#: Beat may use at most this share of one core while the broker is down (it should sleep).
MAX_CPU_SHARE = 0.15

CRON_TASKS = f"""
from celery_app import cron
from support.run_witness import witnessed


for i in range({TASKS}):
    cron("* * * * *", id=f"o{{i}}", name=f"outage.o{{i}}", bind=True)(witnessed(f"o{{i}}"))
"""


def _windows_run_after(r: redis.Redis, since: datetime) -> list[str]:
    by_window = Counter(run.window for run in recorded_runs(r))
    first = window_id(window_start(since) + timedelta(minutes=1))
    return [w for w, n in by_window.items() if n == TASKS and w >= first]


def _outage(tmp_path: Path, r: redis.Redis, outage_s: float, fault_report, label: str) -> None:
    import crash_kinds  # noqa: F401 - the check kind used below

    broker_server = RedisServer(tmp_path / "broker", appendonly=True).start()
    try:
        clock = ahead_clock(RATE, into_window_s=30)
        broker_url = broker_server.url(0)
        env = clocked_env(
            tmp_path, clock, "outage_tasks", CRON_TASKS, imports=("crash_kinds",),
            extra_paths=(HERE,),
            CHECKBEAT_BROKER_URL=broker_url,
            CHECKBEAT_CRON_GRACE="60",
        )  # fmt: skip
        settings = load_settings(broker_url=broker_url)
        CheckStore(r, KEYS, settings).create(
            uid="steady", tenant="t", kind="tracked", target="steady", config={"seconds": 0.01},
            period=1,
        )  # fmt: skip
        procs = Processes(tmp_path, env)
        try:
            procs.worker("-P", "threads", "-c", "4", "-Q", QUEUES, "-n", "outage@w")
            beat = procs.beat()
            wait_for(
                lambda: len(recorded_runs(r)) >= 2 * TASKS,
                60,
                what="two windows before the outage",
            )
            results_before = r.xlen(KEYS.results("steady"))
            assert results_before > 0

            broker_server.stop()
            down_at = time.monotonic()
            cpu_before = beat.cpu_seconds()
            down_sim = clock.now()
            wait_for(lambda: time.monotonic() - down_at >= outage_s, outage_s + 5)
            assert beat.alive(), beat.output()[-3000:]
            cpu_used = beat.cpu_seconds() - cpu_before
            up_sim = clock.now()
            broker_server.start()
            up_at = time.monotonic()

            # Recovery: a window that starts after the broker is back runs all its tasks (the
            # first may be skipped as in-flight: the worker is reconnecting too), and checks run.
            # The bound is generous: kombu's reconnect backoff (2 s growing to 30 s between
            # attempts) dominates it, 18 s on an idle machine, more under a loaded CI run.
            wait_for(
                lambda: _windows_run_after(r, up_sim), 150, what="a whole window after the outage"
            )
            cron_back = time.monotonic() - up_at
            checks_back_from = r.xlen(KEYS.results("steady"))
            wait_for(
                lambda: r.xlen(KEYS.results("steady")) > checks_back_from,
                30,
                what="checks to run again",
            )
            checks_back = time.monotonic() - up_at
            assert beat.alive()
            app = create_app(load_settings(broker_url=broker_url))
            app.loader.import_default_modules()
            findings = CronService(app, clock=clock.now).diagnose()
        finally:
            procs.stop_all()
    finally:
        broker_server.stop()

    counts = run_counts(r)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    # Windows that started while the broker was down: each either ran once (a tick that blocked
    # in kombu's reconnect published it when the broker returned) or diagnose names it.
    dark = []
    w = window_start(down_sim) + timedelta(minutes=1)
    while w + timedelta(minutes=1) <= up_sim:
        dark.append(w)
        w += timedelta(minutes=1)
    pairs = [(f"o{i}", window_id(w)) for w in dark for i in range(TASKS)]
    reported = [
        (task, wid)
        for task, wid in pairs
        if any(
            (f.kind, f.subject) == (FindingKind.NOT_FIRED, task) and window_id(f.since) == wid
            for f in findings
        )
    ]
    ran = [(task, wid) for task, wid in pairs if counts[(task, GLOBAL_TENANT, wid)]]
    unaccounted = [p for p in pairs if p not in reported and p not in ran]
    fault_report.add(
        label,
        runs=sum(counts.values()),
        duplicates=sum(n - 1 for n in duplicates.values()),
        misses=len(unaccounted),
        max_recovery_s=max(cron_back, checks_back),
        outage_s=outage_s,
        beat_cpu_s=round(cpu_used, 3),
        beat_cpu_share=round(cpu_used / outage_s, 4),
        windows_in_outage=len(pairs),
        reported_by_diagnose=len(reported),
        ran_late=len(ran),
    )
    assert dark, "the outage spanned no window: the test proves nothing"
    assert not duplicates, duplicates
    assert cpu_used <= MAX_CPU_SHARE * outage_s, f"beat used {cpu_used:.2f}s CPU in {outage_s}s"
    assert not unaccounted, f"neither run nor reported by diagnose: {unaccounted}; {findings}"
    assert reported, findings


def test_broker_down_15s(tmp_path, r, fault_report):
    _outage(tmp_path, r, 15.0, fault_report, "broker refuses connections 15 s")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broker_down_60s(tmp_path, r, fault_report):
    _outage(tmp_path, r, 60.0, fault_report, "broker refuses connections 60 s")
