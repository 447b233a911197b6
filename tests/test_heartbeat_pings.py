"""Every way a ping reaches a heartbeat check: the HTTP endpoint (``checks serve-pings``, served
here in-process on 127.0.0.1 with the production handler), the CLI as an operator types it,
and the ``checkbeat.heartbeat_ping`` task sent from an app and run by a real worker. Bad pings
get a clear answer and change nothing."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.polling import wait_for
from support.projects import run_module

from celery_app.checks.heartbeat import PING_TASK, PingRefused
from celery_app.checks.jobs import read_job
from celery_app.checks.ping_server import make_server, route

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tok-0123456789abcdefghij"


def _heartbeat(store, uid: str = "hb") -> None:
    store.create(uid=uid, tenant="acme", kind="heartbeat", target="a job", period=60,
                 regions=["eu"], config={"grace": 5, "token": TOKEN})  # fmt: skip


def _last(r, keys, uid: str = "hb") -> dict | None:
    raw = r.hget(keys.last_result(uid), "eu")
    return json.loads(raw) if raw else None


def _request(url: str, body: bytes | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def ping_url(dispatcher_app):
    server = make_server(dispatcher_app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ping"
    server.shutdown()
    server.server_close()


def test_http_pings_and_their_answers(r, keys, store, ping_url):
    _heartbeat(store)
    store.create(uid="web", tenant="acme", kind="heartbeat", target="x", period=60,
                 regions=["eu"])  # fmt: skip
    before = r.hgetall(keys.job("hb@eu"))
    assert _request(f"{ping_url}/nope/{TOKEN}")[0] == 404
    assert _request(f"{ping_url}/hb/{'w' * 24}")[0] == 404  # the same answer: nothing learnt
    assert _request(f"{ping_url}/web/{TOKEN}")[0] == 404  # another check's token
    status, text = _request(f"{ping_url}/hb/{TOKEN}/restart")
    assert status == 400 and "not start, fail or an exit status" in text
    assert _request(f"{ping_url}/hb/{TOKEN}", b"x" * 10_001)[0] == 413
    assert _request(f"{ping_url}/hb/{TOKEN}?duration=abc")[0] == 400
    assert r.hgetall(keys.job("hb@eu")) == before and _last(r, keys) is None

    assert _request(f"{ping_url}/hb/{TOKEN}/start") == (200, "OK\n")
    assert _request(f"{ping_url}/hb/{TOKEN}", b"backed up 42 files") == (200, "OK\n")
    last = _last(r, keys)
    assert last["status"] == "up" and last["detail"]["body"] == "backed up 42 files"
    assert last["duration_ms"] is not None  # from the start ping
    assert _request(f"{ping_url}/hb/{TOKEN}/3") == (200, "OK\n")
    last = _last(r, keys)
    assert last["status"] == "down" and last["detail"]["exit_status"] == 3
    assert _request(f"{ping_url}/hb/{TOKEN}/0?duration=12.5")[0] == 200
    last = _last(r, keys)
    assert last["status"] == "up" and last["duration_ms"] == 12_500
    assert read_job(r, keys, "hb@eu").runs == 3


def test_routes_are_parsed_strictly():
    assert route(f"/ping/a/{TOKEN}") == ("a", TOKEN, "success", None, None)
    assert route(f"/ping/a/{TOKEN}/fail?duration=2") == ("a", TOKEN, "fail", None, 2.0)
    assert route(f"/ping/a/{TOKEN}/0") == ("a", TOKEN, "success", 0, None)
    for bad in ["/", "/ping/a", f"/pong/a/{TOKEN}", f"/ping/a/{TOKEN}/x/y", f"/ping/a/{TOKEN}/-1"]:
        with pytest.raises(ValueError):
            route(bad)


def test_the_cli_pings_and_refuses_in_one_line(r, keys, store):
    _heartbeat(store)
    ok = run_module("celery_app.cli", "-A", "celery_app", "checks", "ping", "hb", "--fail",
                    "--exit-status", "2", cwd=ROOT, pythonpath=[ROOT])  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "fail ping of hb recorded" in ok.stdout
    assert _last(r, keys)["detail"] == {"ping": "fail", "exit_status": 2}
    for args, field in [(["nope"], "uid"), (["hb", "--body", "x" * 10_001], "body")]:
        bad = run_module("celery_app.cli", "-A", "celery_app", "checks", "ping", *args,
                         cwd=ROOT, pythonpath=[ROOT])  # fmt: skip
        lines = [line for line in bad.stderr.splitlines() if line.strip()]
        assert bad.returncode == 2 and len(lines) == 1 and field in lines[0], bad.stderr
        assert "Traceback" not in bad.stderr


def test_the_cli_prints_the_ping_url_a_job_then_calls(r, keys, store, ping_url, test_kind):
    """``checks ping-url`` reveals the token on purpose (the job's script needs it): the URL it
    prints is the one the endpoint takes."""
    _heartbeat(store)
    base = ping_url.removesuffix("/ping")
    shown = run_module("celery_app.cli", "-A", "celery_app", "checks", "ping-url", "hb",
                       "--base", base + "/", cwd=ROOT, pythonpath=[ROOT])  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    url = shown.stdout.strip()
    assert url == f"{base}/ping/hb/{TOKEN}"
    assert _request(url, b"all good")[0] == 200
    assert _last(r, keys)["detail"] == {"ping": "success", "body": "all good"}
    store.create(uid="probed", tenant="acme", kind=test_kind, target="x", period=60,
                 regions=["eu"])  # fmt: skip
    for uid, code, said in [("nope", 1, "nope"), ("probed", 2, "not a heartbeat check")]:
        bad = run_module("celery_app.cli", "-A", "celery_app", "checks", "ping-url", uid,
                         cwd=ROOT, pythonpath=[ROOT])  # fmt: skip
        lines = [line for line in bad.stderr.splitlines() if line.strip()]
        assert bad.returncode == code and len(lines) == 1 and said in lines[0], bad.stderr


@pytest.mark.timeout(60)
def test_a_task_sent_from_any_app_pings_through_a_worker(
    r, keys, store, celery_worker, dispatcher_app
):
    _heartbeat(store)
    dispatcher_app.send_task(PING_TASK, kwargs={"uid": "hb", "kind": "fail", "exit_status": 9},
                             queue="celery")  # fmt: skip
    wait_for(lambda: _last(r, keys) is not None, 30, what="the task's ping recorded")
    assert _last(r, keys)["detail"]["exit_status"] == 9


def test_the_python_client_function_pings_and_publishes(r, keys, store, dispatcher_app):
    from celery_app import ping_heartbeat

    _heartbeat(store)
    assert ping_heartbeat(dispatcher_app, "hb", "fail", exit_status=4).written == 1
    assert _last(r, keys)["detail"] == {"ping": "fail", "exit_status": 4}
    with pytest.raises(PingRefused) as refused:
        ping_heartbeat(dispatcher_app, "hb", "finished")
    assert refused.value.field == "kind"
