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

import httpx
import redis
from celery import Celery

from workers.probes.http import http_probe
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy

RUNS_KEY = "bench:runs"
#: How the benches name the two anchors in their tables: ``bench.get`` and ``bench.get_kept``.
PLAIN_NAME = "plain Celery"
KEPT_NAME = "plain + state"

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


#: One httpx client shared by every thread of the worker: what a hand-written task uses. Made
#: at import, as a task module would: a client made by the first runs (eight threads racing to
#: import httpx and load its CA bundle) would be counted in the measured window.
_http = httpx.Client(timeout=15.0)


def http() -> httpx.Client:
    return _http


@app.task(name="bench.get")
def get(tick_id: str, url: str, scheduled_at: float) -> None:
    """The precision bench's anchor: one GET with a shared client, its start recorded."""
    started = time.time()
    response = http().get(url)
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


#: The least a runner that keeps per-check state must write after a run, by hand: the lease
#: still this run's, then the job's next tick and its cost EWMA, the due index, the result.
KEPT_WRITE = """
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then return 0 end
local ewma = tonumber(redis.call('HGET', KEYS[1], 'ewma') or ARGV[3])
redis.call('HSET', KEYS[1], 'lease', '', 'next', ARGV[2], 'ewma', 0.8 * ewma + 0.2 * ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100, '*', 'r', ARGV[4])
redis.call('RPUSH', KEYS[4], ARGV[4])
return 1
"""
KEPT_DUE = "bench:kept:due"
_kept_write = None


def kept_job(job_id: str) -> str:
    return f"bench:kept:job:{job_id}"


@app.task(name="bench.get_kept")
def get_kept(tick_id: str, token: str, url: str, scheduled_at: float, period_s: float) -> bool:
    """``bench.get`` plus the bookkeeping any lease-checked runner needs, written by hand: one
    read before the probe (the job, the server's time, a first-delivery marker), one guarded
    Lua write after it (which also appends the run to :data:`RUNS_KEY`, as ``bench.get`` does).
    The floor ``bench.run_path_bench`` and ``precision_bench --anchor kept`` hold checkbeat to."""
    global _kept_write
    if _kept_write is None:
        _kept_write = state().register_script(KEPT_WRITE)
    job_key = kept_job(tick_id)
    pipe = state().pipeline(transaction=False)
    pipe.hgetall(job_key)
    pipe.time()
    pipe.set(f"{job_key}:started:{token}", "1", nx=True, ex=60)
    job, (seconds, micros), first = pipe.execute()
    if job.get(b"lease") != token.encode() or not first:
        return False
    wait_s = scheduled_at - (seconds + micros / 1e6)
    if wait_s > 0:
        time.sleep(wait_s)
    started = time.time()
    response = http().get(url)
    record = json.dumps(
        {
            "id": tick_id,
            "scheduled_at": scheduled_at,
            "started_at": started,
            "finished_at": time.time(),
            "ok": response.status_code == 200,
        }
    )
    keys = [job_key, KEPT_DUE, f"{job_key}:results", RUNS_KEY]
    took_ms = (time.time() - started) * 1000.0
    return bool(_kept_write(keys, [token, scheduled_at + period_s, took_ms, record]))


#: ``bench.get_state``'s keys: the check's last result (a hash per check) and the next tick of
#: every check (one sorted set).
STATE_LAST = "bench:state:last:"
STATE_NEXT = "bench:state:next"


@app.task(name="bench.get_state")
def get_state(tick_id: str, uid: str, url: str, scheduled_at: float, period_s: float) -> None:
    """``bench.get`` with the state a hand-written check task keeps, three commands on one
    round trip after the GET: the check's last result (HSET), its next tick (ZADD) and the run's
    record (RPUSH to :data:`RUNS_KEY`). The anchor of ``bench.scale_bench --side-by-side``: what
    Redis spends on a plain Celery task that does a check's work."""
    started = time.time()
    response = http().get(url)
    finished = time.time()
    ok = response.status_code == 200
    pipe = state().pipeline(transaction=False)
    pipe.hset(f"{STATE_LAST}{uid}", mapping={"ok": int(ok), "at": finished, "tick": scheduled_at})
    pipe.zadd(STATE_NEXT, {uid: scheduled_at + period_s})
    pipe.rpush(
        RUNS_KEY,
        json.dumps(
            {
                "id": tick_id,
                "scheduled_at": scheduled_at,
                "started_at": started,
                "finished_at": finished,
                "ok": ok,
            }
        ),
    )
    pipe.execute()


@app.task(name="bench.noop")
def noop(tick_id: str) -> None:
    """``bench.broker_bench``'s anchor: a task with no work of its own, so what its broker
    carries per run is Celery's alone (the send, the delivery with acks, the task events)."""
