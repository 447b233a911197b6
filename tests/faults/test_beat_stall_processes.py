"""A real beat stalled for longer than the cron grace reports every window it did not fire.

Two stalls of 9 graces: the beat SIGSTOPped then SIGCONTed, and the beat blocked inside a Redis
call (``DEBUG SLEEP`` on the server: the beat wakes, reads the time, and waits in its first
command, as during a Sentinel failover). Neither is a clock step (the beat must not log that it
holds one); every window of the stall either ran, once, neither early nor late, or is named by
``schedule diagnose``. Before the engine read its wall and steady clocks together, the blocked
beat held the stall as a forward clock step and ran its windows late, reporting none.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
import redis
from fault_procs import Processes, ahead_clock, clocked_env
from support.partitions import suite_keys
from support.polling import wait_for
from support.run_witness import recorded_runs

from celery_app.cron_tasks.cron_state import parse_window_id
from celery_app.cron_tasks.registration import window_id, window_start
from celery_app.cron_tasks.service import CronService
from celery_app.factory import create_app
from celery_app.findings import FindingKind
from celery_app.redis.schema import CronGapField
from celery_app.settings import load_settings

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

KEYS = suite_keys("cbtest")
MIN = timedelta(minutes=1)
RATE = 60.0  # a one-minute window is one real second
GRACE_S = 20  # simulated seconds: a third of a real second
STALL_REAL_S = 3.0  # 180 simulated seconds: 9 graces, 3 windows
TASK_IDS = ["st0", "st1"]
#: What the cron engine logs when it holds a forward clock step.
STEP_HOLD_LOG = "firing by the steady clock"

TASKS = f"""
from celery_app import cron
from support.run_witness import witnessed


for task_id in {TASK_IDS!r}:
    cron("* * * * *", id=task_id, name=f"stall.{{task_id}}", bind=True)(witnessed(task_id))
"""


def _stall(variant: str, beat_pid: int, redis_url: str) -> None:
    started = time.monotonic()
    if variant == "sigstop":
        os.kill(beat_pid, signal.SIGSTOP)
        try:
            wait_for(lambda: time.monotonic() - started >= STALL_REAL_S, 10, what="the stall")
        finally:
            os.kill(beat_pid, signal.SIGCONT)
    else:  # every client, the beat's included, waits in its next command
        blocker = redis.Redis.from_url(redis_url)
        blocker.execute_command("DEBUG", "SLEEP", STALL_REAL_S)
        blocker.close()


@pytest.mark.parametrize("variant", ["sigstop", "redis-blocked"])
def test_beat_stalled_past_the_grace_reports_every_window_it_did_not_fire(
    variant, tmp_path, r, redis_url, broker_url, fault_report
):
    redis.Redis.from_url(broker_url).flushdb()
    clock = ahead_clock(RATE)
    procs = Processes(
        tmp_path,
        clocked_env(tmp_path, clock, "stall_tasks", TASKS, CHECKBEAT_CRON_GRACE=str(GRACE_S)),
    )
    try:
        procs.worker("-P", "threads", "-c", "4", "-Q", "celery")
        beat = procs.beat()

        def windows_run(task: str) -> set[str]:
            return {run.window for run in recorded_runs(r) if run.task == task}

        wait_for(lambda: len(windows_run("st0")) >= 2, 60, what="two windows before the stall")
        stalled_from = clock.now()
        _stall(variant, beat.pid, redis_url)
        resumed = time.monotonic()
        stalled_to = clock.now()
        last = window_start(stalled_to) + 3 * MIN
        wait_for(
            lambda: all(window_id(last) in windows_run(task) for task in TASK_IDS),
            30,
            what="three windows after the stall",
        )
        recovery = time.monotonic() - resumed
        assert beat.alive(), beat.output()[-3000:]
        beat_log = beat.output()
        beat.stop()
        settings = load_settings(cron_grace=GRACE_S)
        findings = CronService(create_app(settings), clock=clock.now).diagnose()
    finally:
        procs.stop_all()

    runs = [(run.task, run.window, run.at) for run in recorded_runs(r)]
    per_window = Counter((task, window) for task, window, _ in runs)
    early = [(t, w, at) for t, w, at in runs if at < parse_window_id(w).timestamp()]
    # Late: started past the window's deadline by more than another window (slack for a loaded
    # worker), counted from the stall's end for a window due in it: a stall held as a clock step
    # ran every window of the hold 3 minutes after the stall. (A window fired just before Redis
    # itself was blocked starts when Redis answers again: its run key is in Redis.)
    slack = (2 * MIN + timedelta(seconds=GRACE_S)).total_seconds()
    resumed_at = stalled_to.timestamp()
    late = [
        (t, w, at)
        for t, w, at in runs
        if at >= max(parse_window_id(w).timestamp(), resumed_at) + slack
    ]
    gaps = [json.loads(g) for g in r.lrange(KEYS.cron_gaps(), 0, -1)]
    lost: dict[str, list[str]] = {}
    covered = 0
    for task in TASK_IDS:
        ranges = [
            (g[CronGapField.FROM], g[CronGapField.TO]) for g in gaps if g[CronGapField.TASK] == task
        ]
        window = window_start(stalled_from)
        while window <= last:
            if (task, window_id(window)) not in per_window:
                if any(lo <= window.timestamp() < hi for lo, hi in ranges):
                    covered += 1
                else:
                    lost.setdefault(task, []).append(window_id(window))
            window += MIN
    reported = {
        t for t in TASK_IDS if (FindingKind.NOT_FIRED, t) in {(f.kind, f.subject) for f in findings}
    }
    missed_tasks = {t for t in TASK_IDS if any(g[CronGapField.TASK] == t for g in gaps)}
    fault_report.add(
        f"beat stalled 9 graces ({variant})",
        runs=len(runs),
        duplicates=sum(n - 1 for n in per_window.values()),
        misses=sum(map(len, lost.values())),
        max_recovery_s=recovery,
        windows_reported_as_gaps=covered,
        held_as_clock_step=STEP_HOLD_LOG in beat_log,
        ran_late=len(late),
    )
    assert STEP_HOLD_LOG not in beat_log, "a stall was held as a clock step"
    assert all(n == 1 for n in per_window.values()), per_window
    assert early == [] and late == [], (early, late)
    assert lost == {}, (lost, gaps, _logs(tmp_path))
    # The stall cost windows past their grace (a 3-window stall, grace a third of one), and
    # diagnose names each task that lost some.
    assert covered >= 2 * len(TASK_IDS), gaps
    assert missed_tasks <= reported, findings


def _logs(log_dir) -> str:
    """The beat's and the worker's output (a few dozen lines each): what a window lost without
    a gap was last seen doing, since the processes are gone when the assertion reads it."""
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}"
        for log in sorted(log_dir.glob("*.log"))
    )
