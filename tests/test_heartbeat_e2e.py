"""A heartbeat check end to end with real processes, as a user runs it: ``celery beat``, a
worker delivering transitions to an ``@on_transition`` hook, ``checks serve-pings``, and a
shell loop pinging with ``curl``. Pings keep it up; when the loop stops it goes down after the
period and grace (one transition, delivered once); pinging again brings it up (one more)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.polling import wait_for
from support.projects import stop
from support.workers import REPO, worker_env

from celery_app.checks.check_state import read_transitions
from celery_app.checks.store import CheckStore
from celery_app.redis.schema import CheckStateField, JobField, Keys
from celery_app.settings import load_settings

KEYS = Keys("cbtest")
HOOK_QUEUE = "cbtest.transitions"
TOKEN = "hb-token-0123456789abcdef"
ENV = {
    "CHECKBEAT_IMPORTS": "transition_hooks",
    "CHECKBEAT_TRANSITION_QUEUE": HOOK_QUEUE,
    "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",  # the notification receiver is on 127.0.0.1
    "CHECKBEAT_DISPATCH_INTERVAL": "0.2",
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", *args],
        cwd=log.parent, env=worker_env(**ENV), stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def _pinging(url: str, log: Path) -> subprocess.Popen:
    """The user's cron job, in a shell: ping every 0.3 s."""
    loop = f"while true; do curl -fsS -m 2 '{url}' >/dev/null; sleep 0.3; done"
    return subprocess.Popen(["sh", "-c", loop], stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_shell_loop_keeps_it_up_silence_takes_it_down_once_and_back(
    r, broker, tmp_path, start_worker_process, http_receiver
):
    import transition_hooks

    http_receiver.notify_tenant(r, KEYS, "acme", "/hb")

    store = CheckStore(r, KEYS, load_settings())
    store.create(
        uid="loop", tenant="acme", kind="heartbeat", target="a shell loop", period=1,
        failure_threshold=1, success_threshold=1, config={"grace": 1, "token": TOKEN},
    )  # fmt: skip
    port = _free_port()
    server = _start(
        ["checks", "serve-pings", "--bind", f"127.0.0.1:{port}"], tmp_path / "pings.log"
    )
    beat = _start(
        ["beat", "-l", "INFO", "-s", str(tmp_path / "beat-schedule")], tmp_path / "beat.log"
    )
    start_worker_process("-P", "threads", "-c", "2", "-Q", HOOK_QUEUE, "-n", "hooks@hb", **ENV)
    url = f"http://127.0.0.1:{port}/ping/loop/{TOKEN}"
    pinging = None
    try:
        wait_for(lambda: _answers(url), 30, what="the ping server")
        pinging = _pinging(url, tmp_path / "loop.log")
        wait_for(lambda: _runs(r) >= 5, 30, what="the loop's pings recorded")
        assert _state(r) == "up" and _delivered(r, transition_hooks) == []
        stop(pinging)
        wait_for(lambda: _state(r) == "down", 15, what="down after the period and grace")
        wait_for(lambda: len(_delivered(r, transition_hooks)) == 1, 20, what="one delivery")
        pinging = _pinging(url, tmp_path / "loop2.log")
        wait_for(lambda: _state(r) == "up", 15, what="up again")
        wait_for(lambda: len(_delivered(r, transition_hooks)) == 2, 20, what="a second delivery")
        made = [
            (t["from"], t["to"])
            for t in reversed(read_transitions(r, KEYS.check_transitions("loop")))
        ]
        assert made == [("up", "down"), ("down", "up")]
        assert [d["id"] for d in _delivered(r, transition_hooks)] == ["loop#1", "loop#2"]
        # and one notification each at the tenant's receiver
        wait_for(lambda: len(_notified(http_receiver)) == 2, 20, what="two notifications")
        assert _notified(http_receiver) == [
            "[checkbeat] loop (acme) is down", "[checkbeat] loop (acme) is up",
        ]  # fmt: skip
        # a wrong token is a 404 and changes nothing
        before = _runs(r)
        wrong = url.replace(TOKEN, "x" * 20)
        code = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", wrong]
        bad = subprocess.run(code, capture_output=True, text=True)
        assert bad.stdout == "404"
        assert TOKEN not in (tmp_path / "pings.log").read_text()
        assert _runs(r) >= before
    finally:
        if pinging is not None:
            stop(pinging)
        stop(beat)
        stop(server)


def _notified(receiver) -> list[str]:
    """The titles the tenant's JSON webhook received, in order."""
    return [json.loads(got.body)["title"] for got in receiver.got("/hb")]


def _answers(url: str) -> bool:
    done = subprocess.run(["curl", "-s", "-o", "/dev/null", url], capture_output=True)
    return done.returncode == 0


def _runs(r) -> int:
    runs = r.hget(KEYS.job("loop@local"), JobField.RUNS)
    return int(runs or 0)


def _state(r) -> str:
    """The check's announced state (none announced yet: up, as every new check)."""
    return r.hget(KEYS.check_state("loop"), CheckStateField.STATE) or "up"


def _delivered(r, hooks) -> list[dict]:
    return [json.loads(x) for x in r.lrange(hooks.DONE, 0, -1)]
