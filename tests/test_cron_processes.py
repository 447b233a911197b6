"""Exactly once across processes: three engine processes and a beat killed mid-run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from faults.fault_procs import ahead_clock, clocked_env, process_env
from support.cron import T0, sends
from support.polling import wait_for

from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.findings import FindingKind
from celery_app.redis.schema import Keys

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
KEYS = Keys("cbtest")

ENGINE_TASKS = """
from celery_app import cron

def _noop(tenant=None): ...

for i in range(10):
    cron("* * * * *", id=f"single-{i}", name=f"proc.single{i}")(_noop)
cron("* * * * *", id="multi", name="proc.multi", singleton=False)(_noop)
cron("* * * * *", id="fan", name="proc.fan", per_tenant=True)(_noop)
"""


def test_three_engine_processes_send_each_singleton_window_once(tmp_path, broker_url, r):
    import redis

    redis.Redis.from_url(broker_url).flushdb()
    (tmp_path / "proc_tasks.py").write_text(ENGINE_TASKS)
    r.sadd(KEYS.tenants(), *[f"t{i}" for i in range(50)])
    windows = 3
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "cron_engine_process.py"),
                *(f"p{n}", "3", str(windows), T0.isoformat()),
            ],
            cwd=ROOT,
            env=process_env((tmp_path,), CHECKBEAT_IMPORTS="proc_tasks"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    fired = sum(json.loads(out)["fired"] for out, _ in outputs)
    counts = sends(broker_url)
    for k in range(windows):
        wid = window_id(T0 + timedelta(minutes=k))
        for i in range(10):
            assert counts[(f"single-{i}", GLOBAL_TENANT, wid)] == 1
        for t in range(50):
            assert counts[("fan", f"t{t}", wid)] == 1
        assert counts[("multi", GLOBAL_TENANT, wid)] == 3
    assert fired == sum(counts.values()) == windows * (10 + 50 + 3)


BEAT_TASK = """
from celery_app import cron

@cron("* * * * *", id="tick", name="sigkill.tick")
def tick(): ...
"""


def _start_beat(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "beat", "--loglevel", "INFO"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _beat_until(tmp_path: Path, env: dict, done, what: str, stop: signal.Signals) -> None:
    """Run a beat until ``done()`` (at most 30 s), then stop it with ``stop``."""
    beat = _start_beat(tmp_path, env)
    try:
        wait_for(done, timeout=30, what=what)
    finally:
        beat.send_signal(stop)
        beat.wait(15)


@pytest.mark.slow
def test_beat_killed_with_sigkill_then_another_never_fires_twice_and_gap_is_diagnosed(
    tmp_path, cron_app, broker_url, r, run_worker
):
    runs: list[str] = []

    @cron("* * * * *", app=cron_app, id="tick", name="sigkill.tick", bind=True)
    def tick(self):
        runs.append(self.request.cron_window)

    # 60 simulated seconds per real second; starts an hour ahead so messages never expire.
    clock = ahead_clock(60.0, into_window_s=1)
    env = clocked_env(tmp_path, clock, "sigkill_tasks", BEAT_TASK, CHECKBEAT_CRON_GRACE="60")
    stats = KEYS.cron_stats("tick")
    run_worker(cron_app, ["celery"], 2)
    _beat_until(tmp_path, env, lambda: len(runs) >= 3, "the first beat's windows", signal.SIGKILL)
    killed_at = clock.now()
    last_before = r.hget(stats, "last_window")
    # Stay down for longer than a window plus its grace, so windows are lost.
    wait_for(lambda: clock.now() > killed_at + timedelta(minutes=4), timeout=15)
    _beat_until(tmp_path, env, lambda: len(runs) >= 6, "the second beat's windows", signal.SIGTERM)
    wait_for(lambda: r.hget(KEYS.cron_state("tick", GLOBAL_TENANT), "outcome") == "success")
    run_worker.stop()
    assert len(runs) == len(set(runs)), f"a window ran twice: {runs}"
    windows = sorted(datetime.strptime(w, "%Y-%m-%dT%H:%MZ") for w in runs)
    steps = {(b - a) for a, b in pairwise(windows)}
    assert max(steps) >= timedelta(minutes=3), f"expected a gap in {runs}"
    assert last_before is not None
    findings = CronService(cron_app, clock=clock.now).diagnose()
    assert (FindingKind.NOT_FIRED, "tick") in {(f.kind, f.subject) for f in findings}, findings


def _noop() -> None: ...


HARD_LIMIT_TASK = """
import time
from datetime import timedelta
from celery.exceptions import SoftTimeLimitExceeded
from celery_app import cron

@cron("0 3 * * *", id="stuck", name="hard.stuck", timeout=timedelta(seconds=1))
def stuck():
    try:
        time.sleep(60)
    except SoftTimeLimitExceeded:
        time.sleep(60)  # ignores the soft limit: the hard limit kills it
"""


@pytest.mark.slow
def test_hard_time_limit_on_a_prefork_worker_is_recorded_as_a_failure(
    tmp_path, cron_app, broker_url, r
):
    (tmp_path / "hard_tasks.py").write_text(textwrap.dedent(HARD_LIMIT_TASK))
    cron("0 3 * * *", app=cron_app, id="stuck", name="hard.stuck", timeout=timedelta(seconds=1))(
        _noop
    )
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "1",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ],
        cwd=tmp_path,
        env=process_env((tmp_path,), CHECKBEAT_IMPORTS="hard_tasks"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = CronService(cron_app).run_now("stuck")
        assert result.sent
        state_key = KEYS.cron_state("stuck", GLOBAL_TENANT)
        wait_for(
            lambda: r.hget(state_key, "outcome") == "failure",
            timeout=40,
            what="the hard time limit to be recorded",
        )
        state = r.hgetall(state_key)
        assert "TimeLimitExceeded" in state["last_error"], state
        assert state["failed"] == "1"
        assert not r.exists(KEYS.cron_inflight("stuck", GLOBAL_TENANT))  # released
    finally:
        worker.terminate()
        worker.wait(20)
