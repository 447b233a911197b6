"""CPU of one check run's own path, in one thread: checkbeat's against the plain Celery task.

Why: ``precision_bench`` measures a whole worker (consumer, events, pool, probe, write), and its
CPU-per-run figure moves 10-20% between runs on a shared machine. This one isolates the part
that differs: the task body and its post-exec signal, run in this process through Celery's own
tracer (``Task.apply``: the same ``trace_task`` and signals a worker runs), timed with
``time.thread_time`` (this thread's CPU only), against the plain task ``bench.get`` (one GET
with a shared httpx client, one RPUSH), alternated in rounds, the same local target and Redis.

A third system, ``bench.get_kept`` ("plain + state"), is the plain task plus the least
bookkeeping any runner that keeps per-check state needs, written by hand: one read before the
probe (the job's lease, the server's time, a first-delivery marker) and one guarded Lua write
after it (lease, next tick, cost EWMA, due index, result). It is the floor for what checkbeat's
path does on top of plain Celery's (issue #14's CPU target is set against plain Celery).

``python -m bench.run_path_bench [--runs 400] [--rounds 4]``: per system, the mean CPU per run
of each round, the best round, and the ratio of the best rounds. Every run is a claimed job
whose tick is due, written back through the post-exec write; nothing else is due, so the
refill after it finds nothing (``precision_bench`` covers refills).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench.figures import command_line
from celery_app.local.embedded_redis import RedisServer
from tests.support.capacity import register_capacity
from tests.support.http_target import DelayServer

TARGET = "/delay/0"
#: A month: a run's next tick (at the check's phase) is almost never due during the bench, so
#: its refill finds nothing to claim.
PERIOD_S = 31 * 24 * 3600


def _claim(client: redis.Redis, keys, job_id: str, token: str) -> dict:
    """The lease the dispatcher's claim would write, due now: the run_check kwargs for it."""
    from celery_app.redis.clock import server_time
    from celery_app.redis.schema import JobField

    now = server_time(client)
    pipe = client.pipeline(transaction=True)
    pipe.hset(
        keys.job(job_id),
        mapping={
            JobField.LEASE_TOKEN: token,
            JobField.LEASE_EXPIRY: f"{now + 60:.3f}",
            JobField.SCHEDULED_AT: repr(now),
        },
    )
    pipe.zadd(keys.leases("local", 0), {job_id: now + 60})
    pipe.zrem(keys.due(), job_id)
    pipe.execute()
    return {
        "job_id": job_id,
        "lease_token": token,
        "scheduled_at": now,
        "effective_scheduled_at": now,
        "timeout_s": 5.0,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400, help="runs per system and round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)

    logs = Path(tempfile.mkdtemp(prefix="run-path-bench-"))
    redis_server = RedisServer(logs / "redis").start()
    broker_url, state_url = redis_server.url(0), redis_server.url(1)
    os.environ["BENCH_STATE_URL"] = state_url
    import bench.plain_app as plain
    from celery_app.checks.store import CheckStore
    from celery_app.factory import create_app
    from celery_app.redis.schema import Keys
    from celery_app.settings import load_settings
    from workers.tasks import run_check

    settings = load_settings(
        redis_url=state_url, broker_url=broker_url, key_prefix="runpath", regions=["local"],
        allow_private_targets=True, results_history=100,
    )  # fmt: skip
    app = create_app(settings)
    app.loader.import_default_modules()
    state = redis.Redis.from_url(state_url, decode_responses=True)
    keys = Keys(settings.key_prefix)
    register_capacity(state, keys, "bench", "local", 8)
    store = CheckStore(state, keys, settings)
    total = args.runs * (args.rounds + 1)
    with DelayServer() as server:
        url = server.url(TARGET)
        for i in range(total):
            store.create(uid=f"c{i}", tenant="bench", kind="http", target=url, period=PERIOD_S)
        claims = iter([_claim(state, keys, f"c{i}@local", f"t{i}") for i in range(total)])

        def checkbeat_run() -> None:
            run_check.apply(kwargs=next(claims))

        def plain_run() -> None:
            plain.get.apply(args=["t", url, time.time()])

        kept_pipe = state.pipeline(transaction=False)
        for i in range(total):
            kept_pipe.hset(plain.kept_job(f"k{i}"), "lease", f"t{i}")
        kept_pipe.execute()
        kept = iter(range(total))

        def kept_run() -> None:
            i = next(kept)
            plain.get_kept.apply(args=[f"k{i}", f"t{i}", url, time.time(), PERIOD_S])

        plain_name, kept_name = plain.PLAIN_NAME, plain.KEPT_NAME
        systems = (("checkbeat", checkbeat_run), (plain_name, plain_run), (kept_name, kept_run))
        rounds: dict[str, list[float]] = {name: [] for name, _ in systems}
        for r in range(args.rounds + 1):  # the first round warms them up and is not counted
            for name, run in systems:
                spent = 0.0
                for _ in range(args.runs):
                    t0 = time.thread_time()
                    run()
                    spent += time.thread_time() - t0
                if r:
                    rounds[name].append(1000 * spent / args.runs)
        written = sum(1 for i in range(total) if state.xlen(keys.results(f"c{i}")) == 1)
        kept_written = state.zcard(plain.KEPT_DUE)
    redis_server.stop()
    if written != total or kept_written != total:
        print(
            f"only {written} of {total} checkbeat runs and {kept_written} of {total} "
            f"{kept_name} runs were written back",
            file=sys.stderr,
        )
        raise SystemExit(1)
    print(f"one run's own path, {args.runs} runs x {args.rounds} rounds, one thread, "
          f"target {TARGET} on 127.0.0.1 (CPU ms per run)")  # fmt: skip
    print(f"{'':14}{'rounds':>36}{'median':>9}{'best':>8}")
    for name, values in rounds.items():
        shown = " ".join(f"{v:6.3f}" for v in values)
        print(f"{name:14}{shown:>36}{statistics.median(values):9.3f}{min(values):8.3f}")
    print("checkbeat's ratio")
    ours = rounds["checkbeat"]
    ratios = {}
    for name in (plain_name, kept_name):
        theirs = rounds[name]
        median_ratio = statistics.median(ours) / statistics.median(theirs)
        ratios[name] = {"median": median_ratio, "best": min(ours) / min(theirs)}
        label = f"to {name}"
        print(f"{label:<50}{median_ratio:8.2f}x{ratios[name]['best']:7.2f}x")
    return {"runs": args.runs, "cpu ms per run": rounds, "checkbeat / system": ratios}


if __name__ == "__main__":
    command_line(main)
