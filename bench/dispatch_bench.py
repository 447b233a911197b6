"""Dispatch benchmark: claim + publish rate against a plain apply_async loop, and memory per job.

Reproduce (from the repository root, ~1-2 minutes, needs nothing but the venv):

    .venv/bin/python -m bench.dispatch_bench            # 100,000 checks x 3 regions
    .venv/bin/python -m bench.dispatch_bench --quick    # smoke: 1,000 checks
    .venv/bin/python -m bench.dispatch_bench --profile  # and the tick's cProfile top

What it does, on a private redis-server (state db 1, broker db 0):

1. creates N checks in 3 regions (period 60 s, phases spread over the period by the uid jitter
   and the region spread), batched; reports the time and Redis ``used_memory`` per job;
2. registers worker capacity large enough for everything due, advances the clock by
   ``--window`` seconds and times one dispatcher tick: promote, claim (Lua), publish; per
   step, this process's CPU and the redis-server's (``INFO cpu``): where the time went, since
   the two take turns (``--profile``: the tick again under cProfile, its top functions);
3. publishes the same number of ``checkbeat.run_check`` messages with (a) a plain
   ``send_task``/``apply_async`` loop and (b) kombu's ``Producer.batch``, and prints the rates
   side by side with ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import command_line
from celery_app.checks.definition import validate_definition
from celery_app.checks.kinds import check_kind
from celery_app.checks.store import CheckStore
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.publish import KombuBatchPublisher
from celery_app.redis.schema import Keys
from celery_app.settings import load_settings
from tests.support.capacity import register_capacity

REGIONS = ["eu", "us", "ap"]
BENCH_KIND = "bench"


def _register_kind() -> None:
    check_kind(BENCH_KIND)(_bench_probe)


def _bench_probe(target: str, config: dict) -> dict:
    return {"ok": True}


def _used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def _server_cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(
    checks: int, window: float, baseline_max: int | None, out=sys.stdout, *, profile: bool = False
) -> dict:
    import redis

    from celery_app.checks.claiming import promote_due
    from celery_app.checks.dispatch import PROMOTE_BATCH, Dispatcher
    from celery_app.checks.jobs import from_unix

    _register_kind()
    data_dir = Path(tempfile.mkdtemp(prefix="checkbeat-bench-"))
    server = RedisServer(data_dir).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), key_prefix="cb", regions=REGIONS
        )
        app = create_app(settings)
        state = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        broker = redis.Redis.from_url(settings.effective_broker_url)
        keys = Keys(settings.key_prefix)
        store = CheckStore(state, keys, settings)
        t0 = 1_780_000_000.0

        # 1. create
        defs = [
            validate_definition(
                settings,
                uid=f"chk-{i:06d}",
                tenant=f"tenant-{i % 500:03d}",
                kind=BENCH_KIND,
                target=f"https://example-{i % 1000}.test/health",
                period=60,
                regions=REGIONS,
            )
            for i in range(checks)
        ]
        state.execute_command("MEMORY", "PURGE")
        before = _used_memory(state)
        started = time.perf_counter()
        store.create_many(defs, now=from_unix(t0))
        create_s = time.perf_counter() - started
        jobs = checks * len(REGIONS)
        after = _used_memory(state)
        per_job = (after - before) / jobs
        sample_job = state.execute_command("MEMORY", "USAGE", keys.job("chk-000001@eu"))
        sample_check = state.execute_command("MEMORY", "USAGE", keys.check("chk-000001"))

        # 2. dispatch one window
        for region in REGIONS:
            register_capacity(state, keys, f"bench-{region}", region, jobs)
        dispatcher = Dispatcher(app, client=state)
        now = t0 + window
        cpu: list[tuple[float, float]] = []  # (this process, redis-server) at each step's end
        cpu.append((time.process_time(), _server_cpu(state)))
        started = time.perf_counter()
        # the tick's steps one by one, to time each: a promote in batches (the tick's own for a
        # backlog), the claim, the publish
        promoted = promote_due(state, dispatcher.keys, now, PROMOTE_BATCH)
        promote_s = time.perf_counter() - started
        cpu.append((time.process_time(), _server_cpu(state)))
        started = time.perf_counter()
        claims = dispatcher.claim(now).claims
        claim_s = time.perf_counter() - started
        cpu.append((time.process_time(), _server_cpu(state)))
        started = time.perf_counter()
        dispatcher.publish(claims)
        publish_s = time.perf_counter() - started
        cpu.append((time.process_time(), _server_cpu(state)))
        dispatched = len(claims)
        queued = sum(broker.llen(q) for q in broker.keys("checks.*"))
        assert queued == dispatched, (queued, dispatched)
        dispatch_s = promote_s + claim_s + publish_s

        # 3. baselines on the same messages
        _sent, messages = dispatcher._sendable(claims)
        n_base = min(dispatched, baseline_max) if baseline_max else dispatched
        broker.flushdb()
        started = time.perf_counter()
        for m in messages[:n_base]:
            app.send_task(
                m.name,
                kwargs=m.kwargs,
                queue=m.queue,
                time_limit=m.time_limit,
                soft_time_limit=m.soft_time_limit,
            )
        apply_s = time.perf_counter() - started
        broker.flushdb()
        started = time.perf_counter()
        KombuBatchPublisher(app).publish(messages[:n_base])
        kombu_s = time.perf_counter() - started
        broker.flushdb()
        started = time.perf_counter()
        dispatcher.publisher.publish(messages[:n_base])
        lean_s = time.perf_counter() - started
        broker.flushdb()

        apply_rate = n_base / apply_s
        result = {
            "checks": checks,
            "jobs": jobs,
            "create_s": create_s,
            "bytes_per_job": per_job,
            "job_hash_bytes": sample_job,
            "check_hash_bytes": sample_check,
            "dispatched": dispatched,
            "promoted": promoted,
            "dispatch_rate": dispatched / dispatch_s if dispatch_s else 0.0,
            "apply_async_rate": apply_rate,
            "cpu_ms": {
                name: {"python": (b[0] - a[0]) * 1000, "redis": (b[1] - a[1]) * 1000}
                for name, a, b in zip(("promote", "claim", "publish"), cpu, cpu[1:], strict=False)
            },
        }
        cpu_s = sum(ms["python"] + ms["redis"] for ms in result["cpu_ms"].values()) / 1000
        # jobs per second of CPU the tick spent on both sides: what load on the machine does
        # not move (the wall-clock rate also counts the waits for a core)
        result["jobs_per_cpu_s"] = dispatched / cpu_s if cpu_s else 0.0
        p = lambda *a: print(*a, file=out)  # noqa: E731
        p(f"checkbeat dispatch bench: {checks:,} checks x {len(REGIONS)} regions = {jobs:,} jobs")
        p(f"  create (batched Lua, 500/call): {create_s:.2f} s = {jobs / create_s:,.0f} jobs/s")
        p(
            f"  Redis used_memory per job: {per_job:,.0f} bytes (job hash {sample_job} B, "
            f"check hash {sample_check} B / {len(REGIONS)} jobs, index entries; target < 512)"
        )
        p(f"\n  one dispatcher tick over a {window:g} s window: {dispatched:,} jobs due")
        p(
            f"    promote {promote_s * 1000:8.1f} ms   claim {claim_s * 1000:8.1f} ms   "
            f"publish {publish_s * 1000:8.1f} ms"
        )
        p(
            "    CPU (this process / redis-server): "
            + "   ".join(
                f"{name} {ms['python']:.0f} / {ms['redis']:.0f} ms"
                for name, ms in result["cpu_ms"].items()
            )
            + f"   = {result['jobs_per_cpu_s']:,.0f} jobs per CPU second"
        )
        p(f"\n  {'path':44} {'messages':>9} {'seconds':>8} {'msg/s':>9} {'vs apply_async':>15}")
        rows = [
            ("plain send_task/apply_async loop", n_base, apply_s),
            ("kombu Producer.batch + send_task_message", n_base, kombu_s),
            ("make_publisher: Redis fast path (publish only)", n_base, lean_s),
            ("dispatcher: promote + claim + publish", dispatched, dispatch_s),
        ]
        result["paths"] = {}
        for name, n, secs in rows:
            rate = n / secs if secs else 0.0
            p(f"  {name:44} {n:>9,} {secs:>8.2f} {rate:>9,.0f} {rate / apply_rate:>14.1f}x")
            result["paths"][name] = {
                "messages": n,
                "seconds": secs,
                "msg per s": rate,
                "vs apply_async": rate / apply_rate,
            }
        p("  target: dispatcher >= 17,000 jobs/s")
        if profile:
            result["profile"] = _profiled_tick(broker, dispatcher, now + window)
            p("\n" + result["profile"])
        return result
    finally:
        server.stop()


def _profiled_tick(broker, dispatcher, now: float, top: int = 25) -> str:
    """The next window's tick (promote, claim, publish; the workers' capacity holds both
    windows) under cProfile: its top functions by own time. The profiler slows Python, not
    Redis: read it for where Python's share goes."""
    import cProfile
    import io
    import pstats

    broker.flushdb()
    profiler = cProfile.Profile()
    profiler.enable()
    claims = dispatcher.tick(now).claims
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return f"  cProfile of the next window's tick ({len(claims):,} jobs), by own time:\n" + (
        text.getvalue()
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=100_000)
    parser.add_argument("--window", type=float, default=10.0, help="seconds of due jobs")
    parser.add_argument(
        "--baseline-max", type=int, default=None, help="cap the baseline loops' messages"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 checks")
    parser.add_argument(
        "--profile", action="store_true", help="also profile the next window's tick (cProfile)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        return run(1000, 60.0, None, profile=args.profile)
    return run(args.checks, args.window, args.baseline_max, profile=args.profile)


if __name__ == "__main__":
    command_line(main)
