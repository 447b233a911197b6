"""Cron start bench: from a window's start to the task body's start, on an idle system.

Reproduce (from the repository root; starts its own redis-server, beat and worker)::

    python -m bench.cron_start_bench            # 5 entries every second for 20 s
    python -m bench.cron_start_bench --quick    # smoke: a few seconds
    python -m bench.cron_start_bench --profile  # also: where the time goes, stage by stage

A real ``celery beat`` with checkbeat's scheduler and a real threads worker run
``bench/cron_start_app.py``: ``beat_schedule`` entries every second, so every second is a window
(whole seconds, counted from when beat first saw the entries). Each run records its window (the
``cron_window`` header) and when its body started; the lateness is body start minus window start
(one machine, one clock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from bench.cron_start_app import BEAT_STAMPS_KEY, STARTS_KEY, WORKER_STAMPS_KEY
from bench.figures import command_line
from bench.overload_bench import REPO, Worker, base_env, percentile
from celery_app.cron_tasks.cron_state import parse_window_id
from celery_app.local.embedded_redis import RedisServer

#: Stage name -> (from stamp, to stamp); "window" is the window's start.
STAGES = {
    "beat woke": ("window", "woke"),
    "claim": ("woke", "claimed"),
    "publish": ("claimed", "published"),
    "broker to worker": ("published", "received"),
    "worker to prerun": ("received", "prerun"),
    "prerun to body": ("prerun", "started_at"),
}


def stages(records: list[dict], beat: list[dict], worker: list[dict]) -> dict[str, float]:
    """p50 and p99 (ms) of each stage of a window's way from its start to the body."""
    by_window = {b["window"]: b for b in beat}
    by_id = {w["id"]: w for w in worker}
    spans: dict[str, list[float]] = {name: [] for name in STAGES}
    for r in records:
        stamps = {**by_window.get(r["window"], {}), **by_id.get(r["id"], {}), **r}
        stamps["window"] = parse_window_id(r["window"]).timestamp()
        for name, (start, end) in STAGES.items():
            if stamps.get(start) is not None and stamps.get(end) is not None:
                spans[name].append((stamps[end] - stamps[start]) * 1000.0)
    row: dict[str, float] = {}
    for name, values in spans.items():
        row[f"{name} p50 ms"] = percentile(values, 50)
        row[f"{name} p99 ms"] = percentile(values, 99)
    return row


def run(
    entries: int, duration_s: float, profile: bool = False, concurrency: int = 4
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="checkbeat-cron-start-") as tmp:
        logs = Path(tmp)
        server = RedisServer(logs / "redis").start()
        try:
            env = base_env(
                BENCH_BROKER_URL=server.url(0),
                CHECKBEAT_REDIS_URL=server.url(1),
                CHECKBEAT_KEY_PREFIX="cronstart",
                CRON_START_ENTRIES=str(entries),
                CRON_START_PROFILE="1" if profile else "0",
            )
            state = redis.Redis.from_url(server.url(1))
            worker = Worker(
                "bench.cron_start_app", ["-c", str(concurrency), "-E"], env, logs / "worker.log"
            )
            beat_log = (logs / "beat.log").open("wb")
            beat = None
            try:
                worker.wait_ready()
                beat = subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "bench.cron_start_app", "beat",
                     "-l", "INFO"],
                    cwd=REPO, env=env, stdout=beat_log, stderr=subprocess.STDOUT,
                )  # fmt: skip
                time.sleep(duration_s)
            finally:
                if beat is not None:
                    beat.terminate()
                    beat.wait(10)
                worker.stop()
                beat_log.close()
            records = [json.loads(r) for r in state.lrange(STARTS_KEY, 0, -1)]
            beat_stamps = [json.loads(r) for r in state.lrange(BEAT_STAMPS_KEY, 0, -1)]
            worker_stamps = [json.loads(r) for r in state.lrange(WORKER_STAMPS_KEY, 0, -1)]
        finally:
            server.stop()
    records = [r for r in records if r["window"]][entries:]  # the first window is not steady
    late = [(r["started_at"] - parse_window_id(r["window"]).timestamp()) * 1000.0 for r in records]
    row = {
        "runs": len(late),
        "early starts": sum(v < 0 for v in late),
        "start late p50 ms": percentile(late, 50),
        "start late p90 ms": percentile(late, 90),
        "start late p99 ms": percentile(late, 99),
        "start late max ms": max(late, default=float("nan")),
    }
    if profile:
        row.update(stages(records, beat_stamps, worker_stamps))
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--entries", type=int, default=5)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--profile", action="store_true", help="stamp and report every stage")
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's threads")
    args = parser.parse_args(argv)
    # quick: enough for two steady windows per entry after beat's start (a first deployment
    # fires nothing before the first window after beat first saw the entries)
    duration = 7.0 if args.quick else args.duration
    row = run(args.entries, duration, args.profile, args.concurrency)
    print(
        f"\ncron window start -> task body start, {args.entries} entries every 1 s, "
        f"{args.concurrency} worker threads, idle:"
    )
    for name, value in row.items():
        print(f"  {name:<28}{value:>10.2f}")
    return row


if __name__ == "__main__":
    command_line(main)
