"""What redis-py's ``SCRIPT EXISTS`` before every pipelined script costs the caller (issue #14):
one pipeline with one script call, as a worker's completion and a claim read send it, through
a plain redis-py pipeline (``Script.__call__``: SCRIPT EXISTS, then the pipeline) against
checkbeat's :class:`~celery_app.redis.pipelined_scripts.ScriptPipeline` (a bare EVALSHA), side
by side: client CPU and wall time per pipeline, and the SCRIPT commands the server saw.

Reproduce (from the repository root, a few seconds):

    .venv/bin/python -m bench.pipelined_script_bench              # 5,000 pipelines each way
    .venv/bin/python -m bench.pipelined_script_bench --pipelines 500

On a private redis-server; the two ways alternate in rounds, so a loaded machine slows both.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.figures import command_line
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.pipelined_scripts import ScriptClient
from celery_app.redis.schema import JobField, Keys
from celery_app.redis.scripts import run_script

ROUNDS = 5


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.split("|")[0] == "cmdstat_script")


def _pipelines(client: redis.Redis, job_key: str, count: int) -> tuple[float, float]:
    """(CPU s, wall s) of ``count`` pipelines, each one ``tenants.lua`` call."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        pipe = client.pipeline(transaction=False)
        run_script(pipe, "tenants", [job_key])
        pipe.execute()
    return time.process_time() - cpu, time.perf_counter() - wall


def run(pipelines: int, out: Any = sys.stdout) -> dict[str, Any]:
    server = RedisServer(Path(tempfile.mkdtemp(prefix="checkbeat-script-bench-"))).start()
    try:
        url = server.url(1)
        ways = {
            "redis-py Script": redis.Redis.from_url(url, decode_responses=True),
            "checkbeat": ScriptClient.from_url(url, decode_responses=True),
        }
        job_key = Keys("bench").job("u@eu")
        ways["checkbeat"].hset(job_key, JobField.TENANT, "acme")
        totals = {name: [0.0, 0.0, 0] for name in ways}
        per_round = max(1, pipelines // ROUNDS)
        for client in ways.values():  # warm up: connect, load the script
            _pipelines(client, job_key, 10)
        for _ in range(ROUNDS):
            for name, client in ways.items():
                before = _script_calls(client)
                cpu, wall = _pipelines(client, job_key, per_round)
                totals[name][0] += cpu
                totals[name][1] += wall
                totals[name][2] += _script_calls(client) - before
        done = per_round * ROUNDS
        result: dict[str, Any] = {"pipelines": done}
        rows = [
            ("client CPU per pipeline us", 0, 1e6 / done),
            ("wall per pipeline us", 1, 1e6 / done),
            ("SCRIPT commands per pipeline", 2, 1.0 / done),
        ]
        ours, theirs = totals["checkbeat"], totals["redis-py Script"]
        print(f"{done} pipelines of one tenants.lua call each way, {ROUNDS} rounds", file=out)
        print(f"{'metric':32}{'checkbeat':>12}{'redis-py Script':>18}{'ratio':>9}", file=out)
        for label, index, scale in rows:
            a, b = ours[index] * scale, theirs[index] * scale
            ratio = a / b if b else float("nan")
            print(f"{label:32}{a:12.2f}{b:18.2f}{ratio:8.2f}x", file=out)
            result[label] = (a, b)
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=5000)
    return run(parser.parse_args(argv).pipelines)


if __name__ == "__main__":
    command_line(main)
