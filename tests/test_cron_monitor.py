"""Cron tasks watched by heartbeat checks (``beat/cron_monitor.py``), end to end with real
processes: two beats, a worker running a runtime schedule every 2 s, a worker delivering
transitions to an ``@on_transition`` hook and a tenant's JSON webhook. A failing run takes the
task's check down, a good one brings it back, windows nobody runs (the worker stopped) take it
down again, and so do windows no beat fired (both beats away past the deadline, back together):
each transition made once, delivered once to the hook and notified once, although two beats
watch. A per-tenant schedule gets one check per tenant: a run longer than its expected duration
makes its tenant's check degraded, and a tenant that leaves is not reported missing."""

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
from celery_app.checks.notify import NotifyStore, validate_target
from celery_app.redis.schema import CheckField, CheckStateField, CronStateField, JobField, Keys

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


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_per_tenant_checks_an_over_long_run_and_a_tenant_that_leaves(
    r, broker, tmp_path, start_worker_process, http_receiver
):
    """A per-tenant runtime schedule every 2 s (timeout 4 s, expected 1 s) under two beats:
    each tenant gets its own check, of its tenant. acme's runs take 1.8 s: its check goes
    degraded, then up when they are quick again (two transitions, each delivered once to the
    hook and to acme's receiver). globex leaves the tenants: its check is paused and, past the
    deadline it would have had, nothing is reported for it."""
    import transition_hooks
    from cron_monitor_tasks import SLOW

    acme, globex = "cron.tenanted.acme", "cron.tenanted.globex"
    for tenant in ("acme", "globex"):
        url = f"json://127.0.0.1:{http_receiver.port}/{tenant}"
        NotifyStore(r, KEYS).add(validate_target(tenant=tenant, url=url))
    r.sadd(KEYS.tenants(), "acme", "globex")
    added = run_module(
        "celery_app.cli", "-A", "celery_app", "schedule", "add", "tenanted", "--task",
        "cronmon.tenant_job", "--remote-task", "--every", "2s", "--timeout", "4s",
        "--expected-duration", "1s", "--per-tenant", "--overlap", "allow",
        cwd=ROOT, pythonpath=[ROOT, ROOT / "tests"], **ENV,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    beats = [_beat(n, tmp_path) for n in range(2)]
    start_worker_process("-P", "threads", "-c", "4", "-Q", "celery", "-n", "jobs@m", **ENV)
    start_worker_process("-P", "threads", "-c", "2", "-Q", HOOK_QUEUE, "-n", "hooks@m", **ENV)

    def runs(uid: str) -> int:
        return int(r.hget(KEYS.job(f"{uid}@local"), JobField.RUNS) or 0)

    def state(uid: str) -> str:
        return r.hget(KEYS.check_state(uid), CheckStateField.STATE) or "up"

    def delivered(uid: str) -> list[dict]:
        found = [json.loads(x) for x in r.lrange(transition_hooks.DONE, 0, -1)]
        return [d for d in found if d["uid"] == uid]

    try:
        wait_for(lambda: runs(acme) >= 2 and runs(globex) >= 2, 60, what="both tenants pinged")
        for uid, tenant in ((acme, "acme"), (globex, "globex")):
            assert r.hget(KEYS.check(uid), CheckField.TENANT) == tenant
        assert state(acme) == state(globex) == "up"

        r.set(SLOW + "acme", "1.8")  # longer than expected, within the timeout
        wait_for(lambda: state(acme) == "degraded", 30, what="acme degraded by a slow run")
        r.srem(KEYS.tenants(), "globex")
        r.delete(SLOW + "acme")
        wait_for(lambda: state(acme) == "up", 30, what="acme up after a quick run")
        wait_for(lambda: r.hget(KEYS.check(globex), CheckField.ENABLED) == "0", 20,
                 what="globex's check paused")  # fmt: skip
        last = float(r.hget(KEYS.cron_state("tenanted", "globex"), CronStateField.LAST_END))
        wait_for(lambda: float(r.time()[0]) > last + 2 + 5 + 2, 30,
                 what="past the deadline globex's check would have had")  # fmt: skip
        wait_for(lambda: len(delivered(acme)) == 2, 30, what="acme's 2 deliveries")
        made = [t["id"] for t in reversed(read_transitions(r, KEYS.check_transitions(acme)))]
        assert [d["id"] for d in delivered(acme)] == made == [f"{acme}#1", f"{acme}#2"]
        moves = [t["to"] for t in reversed(read_transitions(r, KEYS.check_transitions(acme)))]
        assert moves == ["degraded", "up"]
        wait_for(lambda: len(http_receiver.got("/acme")) == 2, 30, what="acme's 2 notifications")
        assert read_transitions(r, KEYS.check_transitions(globex)) == []
        assert delivered(globex) == [] and http_receiver.got("/globex") == []
        assert len(http_receiver.got("/acme")) == 2  # none twice
    finally:
        _stop_all(beats)
