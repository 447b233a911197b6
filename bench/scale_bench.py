"""Scale bench: Redis commands, bytes and Redis CPU per check run and per cron firing, and what
one Redis core sustains for the check path (docs/scale.md takes its figures from here).

Reproduce (from the repository root, about a minute; --quick is a smoke run)::

    .venv/bin/python -m bench.scale_bench
    .venv/bin/python -m bench.scale_bench --quick

What it does, on two private redis-servers (checkbeat's state on one, the broker on the other,
so each is measured alone), in this process and with checkbeat's own functions:

* check path, per run: beat's promote + claim (Lua) + publish (LPUSH fast path); a worker's
  lease check (HGETALL job + check, one pipeline) and post-exec (``finish_run``: job and TIME,
  ``complete.lua``, then ``refill``: promote + claim + publish for the freed slot). The broker
  side of a delivery (kombu's BRPOP; check queues are consumed without acks, so no unacked
  bookkeeping) is measured separately with kombu's own consumer on a sample of messages.
* cron path, per firing: ``fire`` (claim Lua with the pending record, publish, confirm), the
  worker's ``run_started`` (run key, ``cron_start.lua``) and ``run_finished``.

Each figure is the delta of ``INFO commandstats`` (calls), ``total_net_input_bytes`` +
``total_net_output_bytes`` and ``used_cpu_user + used_cpu_sys`` of the server, divided by the
number of runs or firings. Runs per Redis core = runs / Redis CPU seconds (the clients here are
one Python process, far slower than the server: the server's own CPU is what a shard spends).
WAIT is off (no replica): under Sentinel each protected write adds one WAIT call.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.figures import command_line
from celery_app.checks.definition import validate_definition
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import finish_run, from_unix
from celery_app.checks.kinds import check_kind
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.cron_state import CronStore, FireRequest
from celery_app.cron_tasks.firing import fire
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.pipelined_scripts import ScriptClient
from celery_app.redis.schema import CronOutcome, Keys
from celery_app.settings import load_settings
from scheduling_core import Params
from tests.support.capacity import register_capacity

REGION = "local"
BENCH_KIND = "scalebench"


class ServerMeter:
    """Deltas of one server's commandstats, network bytes and CPU."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = self._read()

    def _read(self) -> tuple[Counter, int, float]:
        stats = self.client.info("commandstats")
        calls = Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})
        info = self.client.info()
        net = int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return calls, net, cpu

    def delta(self) -> tuple[Counter, int, float]:
        calls, net, cpu = self._read()
        c0, n0, u0 = self._start
        diff = Counter({k: calls[k] - c0.get(k, 0) for k in calls})
        diff["info"] -= 2  # the meter's own two INFO calls
        return +diff, net - n0, cpu - u0


def _idle_cpu_per_s(client: redis.Redis, seconds: float = 1.0) -> float:
    """CPU the idle server spends per second (its serverCron): subtracted from the figures,
    since this one Python client keeps the server mostly idle."""
    meter = ServerMeter(client)
    time.sleep(seconds)
    return meter.delta()[2] / seconds


def _check_path(checks: int, out: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="checkbeat-scale-"))
    state_server = RedisServer(tmp / "state").start()
    broker_server = RedisServer(tmp / "broker").start()
    try:
        settings = load_settings(
            redis_url=state_server.url(0),
            broker_url=broker_server.url(0),
            key_prefix="cb",
            regions=[REGION],
            redis_wait_replicas=0,
        )
        app = create_app(settings)
        check_kind(BENCH_KIND)(lambda target, config: True)
        # the state client's class is get_redis's: its pipelines send no SCRIPT EXISTS
        state = ScriptClient.from_url(settings.redis_url, decode_responses=True)
        broker = redis.Redis.from_url(settings.effective_broker_url)
        keys = Keys(settings.key_prefix)
        store = CheckStore(state, keys, settings)
        t0 = time.time() - 120
        defs = [
            validate_definition(
                settings,
                uid=f"c{i:06d}",
                tenant=f"t{i % 50}",
                kind=BENCH_KIND,
                target=f"https://e{i}.test/",
                period=60,
                regions=[REGION],
            )
            for i in range(checks)
        ]
        store.create_many(defs, now=from_unix(t0))
        register_capacity(state, keys, "bench", REGION, 64)
        dispatcher = Dispatcher(app, client=state)
        params = Params.from_settings(settings)
        idle_cpu_per_s = _idle_cpu_per_s(state)
        state_meter, broker_meter = ServerMeter(state), ServerMeter(broker)
        runs = 0
        started = time.perf_counter()
        now = time.time()
        dispatcher.promote(now)
        pending = list(dispatcher.claim(now).claims)  # beat's tick
        dispatcher.publish(pending)
        while pending and runs < checks:
            claim = pending.pop()
            # the worker: lease check, then post-exec and the refill of the freed slot
            pipe = state.pipeline(transaction=False)
            pipe.hgetall(keys.job(claim.job_id))
            pipe.hgetall(keys.check(claim.job_id.split("@")[0]))
            pipe.execute()
            finish_run(
                state,
                keys,
                params,
                claim.job_id,
                claim.lease_token,
                duration_ms=5.0,
                timed_out=False,
                exec_start=None,
                scheduled_at=claim.scheduled_at,
            )
            pending.extend(dispatcher.refill(REGION))  # the worker's refill_after_run
            runs += 1
        wall_s = time.perf_counter() - started
        s_calls, s_net, s_cpu = state_meter.delta()
        s_cpu = max(1e-9, s_cpu - idle_cpu_per_s * wall_s)  # the server's own idle ticks
        b_calls, b_net, _ = broker_meter.delta()
        depths = {q: broker.llen(q) for q in sorted(broker.keys("checks.*"))}
        queued = sum(depths.values())
        # the broker side of a delivery, with kombu's own consumer, from every lane's queue
        # (a check's first run is in the slow lane: it was never measured), consumed as a
        # check worker does: without acks (workers.worker_step.consume_without_acks)
        sample = min(queued, 300)
        consume_meter = ServerMeter(broker)
        left = sample
        with app.connection_for_read() as conn:
            for name, depth in depths.items():
                queue = conn.SimpleQueue(
                    name if isinstance(name, str) else name.decode(), no_ack=True
                )
                for _ in range(min(depth, left)):
                    queue.get(timeout=5).ack()
                    left -= 1
                queue.close()
        k_calls, k_net, _ = consume_meter.delta()
        result = {
            "runs": runs,
            "state_commands_per_run": sum(s_calls.values()) / runs,
            "state_bytes_per_run": s_net / runs,
            "state_cpu_us_per_run": s_cpu / runs * 1e6,
            "runs_per_redis_core_s": runs / s_cpu,
            "idle_cpu_ms_per_s": idle_cpu_per_s * 1000,
            "publish_commands_per_run": sum(b_calls.values()) / runs,
            "publish_bytes_per_run": b_net / runs,
            "consume_commands_per_message": sum(k_calls.values()) / max(1, sample),
            "consume_bytes_per_message": k_net / max(1, sample),
            "client_runs_per_s": runs / wall_s,
        }
        p = lambda *a: print(*a, file=out)  # noqa: E731
        p(f"check path: {runs:,} runs of {checks:,} checks (one region, period 60 s)")
        p(
            f"  state Redis per run: {result['state_commands_per_run']:.1f} commands, "
            f"{result['state_bytes_per_run']:,.0f} bytes in+out, "
            f"{result['state_cpu_us_per_run']:.0f} us of Redis CPU"
        )
        top = ", ".join(f"{k} {v / runs:.2f}" for k, v in s_calls.most_common(8))
        p(f"    commands per run: {top}")
        p(
            f"  broker per run: publish {result['publish_commands_per_run']:.2f} commands "
            f"{result['publish_bytes_per_run']:,.0f} B; kombu delivery+ack "
            f"{result['consume_commands_per_message']:.1f} commands "
            f"{result['consume_bytes_per_message']:,.0f} B (sample {sample})"
        )
        kb = ", ".join(f"{k} {v / max(1, sample):.2f}" for k, v in k_calls.most_common(6))
        p(f"    kombu commands per message: {kb}")
        per_core = result["runs_per_redis_core_s"]
        p(
            f"  one Redis core: {per_core:,.0f} runs/s of the check path = "
            f"{per_core * 60:,.0f} checks of 60 s period at 100 % "
            f"({per_core * 60 * 0.5:,.0f} at a 50 % CPU target)"
        )
        p(
            f"  (this single Python client drove {result['client_runs_per_s']:,.0f} runs/s; the "
            f"server's idle {result['idle_cpu_ms_per_s']:.1f} ms CPU/s is subtracted)"
        )
        return result
    finally:
        broker_server.stop()
        state_server.stop()


def _noop() -> None:
    """The body of the bench's cron tasks (never run here)."""


def _cron_path(tasks: int, windows: int, out: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="checkbeat-scale-cron-"))
    state_server = RedisServer(tmp / "state").start()
    broker_server = RedisServer(tmp / "broker").start()
    try:
        settings = load_settings(
            redis_url=state_server.url(0),
            broker_url=broker_server.url(0),
            key_prefix="cb",
            redis_wait_replicas=0,
        )
        app = create_app(settings)
        for i in range(tasks):
            cron("* * * * *", id=f"b{i}", name=f"scalebench.b{i}", app=app)(_noop)
        all_tasks = list(cron_tasks(app).values())
        # the state client's class is get_redis's: its pipelines send no SCRIPT EXISTS
        state = ScriptClient.from_url(settings.redis_url, decode_responses=True)
        broker = redis.Redis.from_url(settings.effective_broker_url)
        store = CronStore(state, Keys("cb"), settings.cron_grace)
        sender = CronPublisher(app, settings.cron_grace)
        sender.prepare(all_tasks)
        base = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        state_meter, broker_meter = ServerMeter(state), ServerMeter(broker)
        firings = 0
        for w in range(windows):
            window = base + timedelta(minutes=w)
            requests = [FireRequest(task, GLOBAL_TENANT, window) for task in all_tasks]
            done = fire(store, sender, requests, now=window, owner="bench")
            for req in done.fired:
                started = window + timedelta(seconds=1)
                store.run_started(req.task.id, req.tenant, req.window_id, False, started)
                store.run_finished(
                    req.task.id, req.tenant, req.window_id, CronOutcome.SUCCESS, "", started
                )
            firings += len(done.fired)
        s_calls, s_net, s_cpu = state_meter.delta()
        b_calls, b_net, _ = broker_meter.delta()
        assert firings == tasks * windows, firings
        result = {
            "firings": firings,
            "state_commands_per_firing": sum(s_calls.values()) / firings,
            "state_bytes_per_firing": s_net / firings,
            "state_cpu_us_per_firing": s_cpu / firings * 1e6,
            "publish_commands_per_firing": sum(b_calls.values()) / firings,
            "publish_bytes_per_firing": b_net / firings,
        }
        p = lambda *a: print(*a, file=out)  # noqa: E731
        p(f"\ncron path: {firings:,} firings ({tasks} tasks x {windows} windows, one beat)")
        p(
            f"  state Redis per firing: {result['state_commands_per_firing']:.2f} commands, "
            f"{result['state_bytes_per_firing']:,.0f} bytes in+out, "
            f"{result['state_cpu_us_per_firing']:.0f} us of Redis CPU"
        )
        top = ", ".join(f"{k} {v / firings:.3f}" for k, v in s_calls.most_common(8))
        p(f"    commands per firing: {top}")
        p(
            f"  broker per firing (publish only): {result['publish_commands_per_firing']:.3f} "
            f"commands, {result['publish_bytes_per_firing']:,.0f} B"
        )
        return result
    finally:
        broker_server.stop()
        state_server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (seconds)")
    args = parser.parse_args(argv)
    checks, tasks, windows = (300, 50, 2) if args.quick else (3000, 500, 6)
    return {
        "checks": _check_path(checks, sys.stdout),
        "cron": _cron_path(tasks, windows, sys.stdout),
    }


if __name__ == "__main__":
    command_line(main)
