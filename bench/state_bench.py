"""What moving the check state costs the post-exec write: completions per second with the state
(``finish_run_with_health`` with the worker's HealthPlanner: region step, the maintenance
version read with the job, quorum and transitions in complete.lua) against the same write
with a ``health_of`` that moves no state (the plain write), side by side, as a ratio.

Reproduce (from the repository root, well under a minute):

    .venv/bin/python -m bench.state_bench            # 2,000 completions each way
    .venv/bin/python -m bench.state_bench --runs 200

On a private redis-server: N checks in 3 regions, each job leased by hand then completed once,
one completion as a worker does it (read the job and Redis time, then the Lua call). Every
tenth run fails and the quorum is 1, so about one run in five makes a transition.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import command_line
from celery_app.checks.check_state import HealthPlanner, result_state
from celery_app.checks.completion import finish_run_with_health
from celery_app.checks.kinds import check_kind
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.schema import JobField, Keys, job_id
from celery_app.settings import load_settings

REGIONS = ["eu", "us", "ap"]


def _lease(client, keys: Keys, jid: str, token: str) -> None:
    client.hset(keys.job(jid), mapping={JobField.LEASE_TOKEN: token, JobField.LEASE_EXPIRY: "1"})


def _no_state(job, now) -> None:
    """``health_of`` of the plain write: the check's state is not moved."""
    return None


def _time(runs: int, complete) -> float:
    start = time.perf_counter()
    for i in range(runs):
        complete(i)
    return time.perf_counter() - start


def run(runs: int, out=sys.stdout) -> dict:
    import redis

    check_kind("statebench")(lambda target, config: True)
    server = RedisServer(Path(tempfile.mkdtemp(prefix="checkbeat-state-bench-"))).start()
    try:
        url = server.url(1)
        settings = load_settings(redis_url=url, broker_url=server.url(0), regions=REGIONS)
        client = redis.Redis.from_url(url, decode_responses=True)
        keys = Keys(settings.key_prefix)
        store = CheckStore(client, keys, settings)
        checks = max(1, runs // len(REGIONS))
        for i in range(checks):
            store.create(
                uid=f"s{i}", tenant="t", kind="statebench", target="x", period=60,
                regions=REGIONS, failure_threshold=1, success_threshold=1, quorum=1,
            )  # fmt: skip
        jobs = [job_id(f"s{i % checks}", REGIONS[(i // checks) % 3]) for i in range(runs)]

        def plain(i: int) -> None:
            _lease(client, keys, jobs[i], f"p{i}")
            finish_run_with_health(
                client, keys, store.params, jobs[i], f"p{i}",
                duration_ms=5.0, timed_out=False, exec_start=None, health_of=_no_state,
            )  # fmt: skip

        def with_state(i: int) -> None:
            _lease(client, keys, jobs[i], f"h{i}")
            result = result_state(i % 10 != 0)
            finish_run_with_health(
                client, keys, store.params, jobs[i], f"h{i}",
                duration_ms=5.0, timed_out=False, exec_start=None,
                health_of=HealthPlanner(client, keys, settings, result),
            )  # fmt: skip

        plain_s = _time(runs, plain)
        state_s = _time(runs, with_state)
        made = client.zcard(keys.transition_outbox())
        report = {
            "runs": runs,
            "plain_per_s": runs / plain_s,
            "state_per_s": runs / state_s,
            "ratio": state_s / plain_s,
            "transitions": made,
        }
        print(f"completions: {runs} each way, {made} transitions made", file=out)
        print(f"  without the state  {report['plain_per_s']:9.0f} /s", file=out)
        print(f"  with the state     {report['state_per_s']:9.0f} /s", file=out)
        print(f"  time ratio (state / plain) {report['ratio']:.2f}x", file=out)
        return report
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args(argv)
    return run(args.runs)


if __name__ == "__main__":
    command_line(main)
