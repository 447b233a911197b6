"""The anchors of the overload bench: plain Celery, no checkbeat scheduling.

``celery -A bench.plain_app worker -Q <queues> -c <n> -P threads`` runs ``bench.probe``: the
same HTTP probe checkbeat runs, recording when it started against when it was due. The broker and
the record store come from ``BENCH_BROKER_URL`` / ``BENCH_STATE_URL``. Same worker settings as
checkbeat's (prefetch 1, late acks, JSON), so only the scheduling differs.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from workers.probes.http import http_probe
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy

RUNS_KEY = "bench:runs"

app = Celery("bench-plain", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
_state: redis.Redis | None = None


def state() -> redis.Redis:
    global _state
    if _state is None:
        _state = redis.Redis.from_url(os.environ.get("BENCH_STATE_URL", "redis://127.0.0.1:6379/1"))
    return _state


@app.task(name="bench.probe")
def probe(tick_id: str, uid: str, kind: str, url: str, scheduled_at: float) -> None:
    started = time.time()
    result = http_probe(url, {}, ProbeContext(15.0, AddressPolicy(allow_private=True)))
    record = {
        "id": tick_id,
        "uid": uid,
        "kind": kind,
        "scheduled_at": scheduled_at,
        "started_at": started,
        "finished_at": time.time(),
        "ok": result.ok,
    }
    state().rpush(RUNS_KEY, json.dumps(record))


_http = None


def http() -> object:
    """One httpx client shared by every thread of the worker: what a hand-written task uses."""
    global _http
    if _http is None:
        import httpx

        _http = httpx.Client(timeout=15.0)
    return _http


@app.task(name="bench.get")
def get(tick_id: str, url: str, scheduled_at: float) -> None:
    """The precision bench's anchor: one GET with a shared client, its start recorded."""
    started = time.time()
    response = http().get(url)  # type: ignore[attr-defined]
    state().rpush(
        RUNS_KEY,
        json.dumps(
            {
                "id": tick_id,
                "scheduled_at": scheduled_at,
                "started_at": started,
                "finished_at": time.time(),
                "ok": response.status_code == 200,
            }
        ),
    )
