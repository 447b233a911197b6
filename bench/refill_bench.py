"""Refill benchmark: the CPU and Redis round trips of a claim of work due within the lead
(``Dispatcher._promote_claim``, which beat's dispatcher runs as jobs enter the lead and a refill
runs after due work when slots are left), the merged path against the separate one.

Reproduce (from the repository root, ~20 s, needs nothing but the venv):

    .venv/bin/python -m bench.refill_bench

Why: until the refill left the lead's jobs to beat (issue #14), most runs under spare capacity
ended with such a claim in the worker (promote what is due within ``CHECKBEAT_DISPATCH_LEAD``,
claim it), so its cost was part of the worker's CPU per run; it is still beat's per job.
On a private redis-server, N checks are created; then, job by job in due order, at
an instant 20 ms before its tick (the due index spread: one job due per refill), (a)
``promote`` then ``claim`` (what main did: the due ids, the promote, the region's state, the
candidates, the claim) and (b) the merged ``Dispatcher._promote_claim`` (the due ids with the
state, the promote with the candidates, the claim), alternating blocks of each. Printed side by
side: process CPU and round trips (sends on the client's connections, redis-py's SCRIPT EXISTS
counted apart) per refill, and the ratio.
``--no-script-exists``: redis-py's pipeline SCRIPT EXISTS skipped (the scripts are loaded
first), what pipelined scripts cost once they are queued as plain EVALSHA.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench.figures import command_line
from celery_app.checks.claiming import Promotions
from celery_app.checks.definition import validate_definition
from celery_app.checks.kinds import check_kind
from celery_app.checks.store import CheckStore
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.client import get_redis
from celery_app.redis.schema import Keys
from celery_app.redis.scripts import lua_source
from celery_app.settings import load_settings
from tests.support.capacity import register_capacity
from tests.support.round_trips import command_name, counting_client

KIND = "refillbench"
REGION = "local"
AHEAD_S = 0.02  # each refill runs this long before the job's tick (inside the 50 ms lead)
SCAN = 200  # the refill's rate-limited scan (dispatch.REFILL_RATE_LIMITED_SCAN)


def _probe(target: str, config: dict) -> dict:
    return {"ok": True}


def _skip_script_exists() -> None:
    """Pipelines send no SCRIPT EXISTS (every script is loaded before the first refill)."""
    redis.client.Pipeline.load_scripts = lambda self: None


def run(checks: int, blocks: int, no_exists: bool = False, out=sys.stdout) -> dict[str, float]:
    from celery_app.checks.claiming import promote_due
    from celery_app.checks.dispatch import PROMOTE_BATCH, Dispatcher
    from celery_app.checks.jobs import from_unix

    check_kind(KIND)(_probe)
    server = RedisServer(Path(tempfile.mkdtemp(prefix="checkbeat-refill-bench-"))).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), key_prefix="rb", regions=[REGION]
        )
        app = create_app(settings)
        state = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        keys = Keys(settings.key_prefix)
        t0 = 1_780_000_000.0
        CheckStore(state, keys, settings).create_many(
            [
                validate_definition(
                    settings, uid=f"c{i:05d}", tenant="t", kind=KIND, target="x", period=60
                )
                for i in range(checks)
            ],
            now=from_unix(t0),
        )
        register_capacity(state, keys, "bench", REGION, checks)
        # checkbeat's client class (how it queues pipelined scripts), on counting connections
        client, sends = counting_client(
            settings.redis_url, type(get_redis(settings.redis_url, settings))
        )
        dispatcher = Dispatcher(app, client=client)
        # one job per tick, 0.2 s apart (phases are whole seconds: many jobs share a tick)
        jobs = state.zrange(keys.due(), 0, -1)
        ticks = [t0 + 100 + 0.2 * i for i in range(len(jobs))]
        state.zadd(keys.due(), dict(zip(jobs, ticks, strict=True)))
        dispatcher.claim(ticks[0] - 1, (REGION,))  # warm: workers known
        for name in ("due", "promote", "top", "claim"):
            state.script_load(lua_source(name))
        if no_exists:
            _skip_script_exists()
        per_block = len(ticks) // (2 * blocks)
        totals = {name: [0.0, 0, 0, 0, 0] for name in ("separate", "merged")}
        for b in range(2 * blocks):
            name = "separate" if b % 2 == 0 else "merged"
            block = ticks[b * per_block : (b + 1) * per_block]
            sends.clear()
            cpu0 = time.process_time()
            claimed = 0
            for tick in block:
                now = tick - AHEAD_S
                if name == "separate":
                    lead = now + settings.dispatch_lead
                    promote_due(client, dispatcher.keys, lead, PROMOTE_BATCH)
                    got = dispatcher.claim(now, (REGION,), rate_limited_scan=SCAN)
                else:
                    got = dispatcher._promote_claim(
                        now + settings.dispatch_lead,
                        (REGION,),
                        SCAN,
                        dispatcher._first_rounds((REGION,), SCAN),
                        Promotions(),
                        claim_at=now,
                    )[1]
                claimed += len(got.claims)
            t = totals[name]
            t[0] += time.process_time() - cpu0
            t[1] += len(block)
            t[2] += claimed
            script = sum(1 for s in sends if command_name(s) == "SCRIPT")
            t[3] += len(sends) - script
            t[4] += script
    finally:
        server.stop()
    rows = {}
    for name, (cpu, n, claimed, trips, script) in totals.items():
        rows[name] = {
            "refills": n,
            "claims per refill": claimed / n,
            "client CPU per refill ms": 1000.0 * cpu / n,
            "round trips per refill": trips / n,
            "+ SCRIPT EXISTS per refill": script / n,
        }
    exists = "SCRIPT EXISTS skipped" if no_exists else "checkbeat's client"
    print(
        f"\n{checks} checks, {2 * blocks} alternating blocks of {per_block} refills, {exists}",
        file=out,
    )
    print(f"{'metric':30} {'separate':>10} {'merged':>10} {'ratio':>8}", file=out)
    for metric in rows["merged"]:
        a, m = rows["separate"][metric], rows["merged"][metric]
        print(f"{metric:30} {a:10.3f} {m:10.3f} {m / a if a else float('nan'):7.2f}x", file=out)
    return {f"{name} {k}": v for name, row in rows.items() for k, v in row.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=4, help="blocks per path, alternated")
    parser.add_argument("--no-script-exists", action="store_true", help=_skip_script_exists.__doc__)
    args = parser.parse_args(argv)
    return run(args.checks, args.blocks, args.no_script_exists)


if __name__ == "__main__":
    command_line(main)
