"""Cron tasks watched by heartbeat checks (``beat/cron_monitor.py``), end to end with real
processes: two beats, a worker running a runtime schedule every 2 s, a worker delivering
transitions to an ``@on_transition`` hook and a tenant's JSON webhook. A failing run takes the
task's check down, a good one brings it back, windows nobody runs (the worker stopped) take it
down again, and so do windows no beat fired (both beats away past the deadline, back together):
each transition made once, delivered once to the hook and notified once, although two beats
watch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.polling import wait_for
from support.projects import run_module, stop
from support.workers import REPO, worker_env

from celery_app.checks.check_state import read_transitions
from celery_app.redis.schema import CheckStateField, JobField, Keys

KEYS = Keys("cbtest")
ROOT = Path(__file__).resolve().parents[1]
HOOK_QUEUE = "cbtest.transitions"
UID = "cron.nightly"
ENV = {
    "CHECKBEAT_IMPORTS": "transition_hooks,cron_monitor_tasks",
    "CHECKBEAT_TRANSITION_QUEUE": HOOK_QUEUE,
    "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",  # the notification receiver is on 127.0.0.1
    "CHECKBEAT_DISPATCH_INTERVAL": "0.2",
    "CHECKBEAT_CRON_GRACE": "1",
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}


def _beat(n: int, tmp_path: Path) -> subprocess.Popen:
    log = (tmp_path / f"beat-{n}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "beat", "-l", "INFO",
         "-s", str(tmp_path / f"beat-{n}-schedule")],
        cwd=tmp_path, env=worker_env(**ENV), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _state(r) -> str:
    return r.hget(KEYS.check_state(UID), CheckStateField.STATE) or "up"


def _delivered(r, hooks) -> list[dict]:
    return [json.loads(x) for x in r.lrange(hooks.DONE, 0, -1) if json.loads(x)["uid"] == UID]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_failed_run_and_missed_windows_each_make_one_transition_delivered_once(
    r, broker, tmp_path, start_worker_process, http_receiver
):
    import cron_monitor_tasks
    import transition_hooks

    http_receiver.notify_tenant(r, KEYS, "cron", "/cron")

    added = run_module(
        "celery_app.cli", "-A", "celery_app", "schedule", "add", "nightly", "--task",
        "cronmon.job", "--remote-task", "--every", "2s", "--timeout", "2s",
        cwd=ROOT, pythonpath=[ROOT, ROOT / "tests"], **ENV,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    beats = [_beat(n, tmp_path) for n in range(2)]
    runner = start_worker_process("-P", "threads", "-c", "2", "-Q", "celery", "-n", "jobs@m", **ENV)
    start_worker_process("-P", "threads", "-c", "2", "-Q", HOOK_QUEUE, "-n", "hooks@m", **ENV)
    try:
        wait_for(lambda: r.exists(KEYS.check(UID)), 40, what="the task's heartbeat check")
        wait_for(lambda: int(r.hget(KEYS.job(f"{UID}@local"), JobField.RUNS) or 0) >= 2, 40,
                 what="two runs pinged")  # fmt: skip
        assert _state(r) == "up" and _delivered(r, transition_hooks) == []

        r.set(cron_monitor_tasks.FAIL, 1)
        wait_for(lambda: _state(r) == "down", 30, what="down after a failed run")
        r.delete(cron_monitor_tasks.FAIL)
        wait_for(lambda: _state(r) == "up", 30, what="up after a good run")

        runner.stop()  # windows keep firing, nobody runs them
        wait_for(lambda: _state(r) == "down", 40, what="down after missed windows")
        wait_for(lambda: len(_delivered(r, transition_hooks)) == 3, 40, what="3 deliveries")
        made = [t["id"] for t in reversed(read_transitions(r, KEYS.check_transitions(UID)))]
        delivered = [d["id"] for d in _delivered(r, transition_hooks)]
        assert delivered == made == [f"{UID}#1", f"{UID}#2", f"{UID}#3"]
        wait_for(lambda: len(http_receiver.got("/cron")) == 3, 30, what="3 notifications")
        titles = [json.loads(got.body)["title"] for got in http_receiver.got("/cron")]
        assert [t.rsplit(" ", 1)[1] for t in titles] == ["down", "up", "down"]
        last = json.loads(r.hget(KEYS.last_result(UID), "local"))
        assert "no success ping by" in last["error"]

        # windows no beat fired: both beats away past the deadline, then back together
        start_worker_process("-P", "threads", "-c", "2", "-Q", "celery", "-n", "jobs2@m", **ENV)
        wait_for(lambda: _state(r) == "up", 40, what="up again with a worker")
        _stop_all(beats)
        deadline = float(r.hget(KEYS.job(f"{UID}@local"), JobField.SCHEDULED_AT))
        wait_for(lambda: float(r.time()[0]) > deadline + 1, 30, what="the deadline passed")
        beats = [_beat(n + 2, tmp_path) for n in range(2)]
        wait_for(lambda: len(_delivered(r, transition_hooks)) == 6, 60, what="6 deliveries")
        made = [t["id"] for t in reversed(read_transitions(r, KEYS.check_transitions(UID)))]
        delivered = [d["id"] for d in _delivered(r, transition_hooks)]
        assert sorted(delivered) == sorted(made) and len(set(delivered)) == 6  # in any order
        assert [t["to"] for t in reversed(read_transitions(r, KEYS.check_transitions(UID)))] == [
            "down", "up", "down", "up", "down", "up",
        ]  # fmt: skip
        wait_for(lambda: len(http_receiver.got("/cron")) == 6, 30, what="6 notifications")
    finally:
        _stop_all(beats)


def _stop_all(beats: list[subprocess.Popen]) -> None:
    for beat in beats:
        stop(beat, 15)
