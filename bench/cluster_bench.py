"""Cluster bench (``python -m bench.scale_bench --cluster``): the check half in 12 partitions on
a local three-master Redis Cluster, what a check run costs each master, how evenly the masters
share it, and one beat tick over a million checks stored across the cluster.

Reproduce (from the repository root)::

    .venv/bin/python -m bench.scale_bench --cluster            # 1,000,000 checks: minutes
    .venv/bin/python -m bench.scale_bench --cluster --quick    # 20,000 checks: a smoke run

What it does, on a cluster of three masters started here from the bundled redis-server
(``tests/support/cluster.py``: equal slot ranges, as ``redis-cli --cluster create`` gives) and a
separate plain redis-server for the broker, with checkbeat's own functions in this process:

* per run, on each master: ``--run-checks`` checks (one region, period 60 s), each run twice,
  the second round measured, as ``bench/scale_bench.py`` does on one Redis (all due at once;
  beat's tick of every partition: promote, claim, publish; then each message taken with kombu's
  consumer without acks and run through the worker's functions: the start read, then
  ``post_exec.record_outcome``, the completion with its hand-off or refill). Each master's
  ``INFO commandstats`` and ``used_cpu_user + used_cpu_sys`` deltas (its idle serverCron CPU
  subtracted) are divided by the runs of the checks whose partitions it holds. The balance is
  the busiest master's CPU over the masters' mean (target <= 1.3).
* one beat tick: ``--checks`` checks created in batches (``CheckStore.create_many``, one
  partition per Lua call) at a fixed instant, every partition's dispatcher (as beat runs them:
  one after the other in one process) ticked once at that instant plus ``--tick-window`` seconds:
  the jobs due then are promoted, claimed and published; jobs published per second of the
  tick's wall time. Memory per job: the masters' ``used_memory`` delta over the creation,
  divided by the jobs created (on each master: by the jobs it holds).

The Python client here is far slower than the servers; the servers' own CPU is what a shard
spends, so it is what the per-run figures count.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from bench.scale_bench import BENCH_KIND, REGION, WORKER, RunConsumer, ServerMeter, _run_all
from celery_app.checks.definition import validate_definition
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import from_unix
from celery_app.checks.kinds import check_kind
from celery_app.checks.store import CheckStore
from celery_app.factory import create_app
from celery_app.redis.client import get_redis, reset_clients
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import partition_of, partition_tags
from celery_app.settings import load_settings
from scheduling_core import Params
from tests.support.capacity import register_capacity
from tests.support.cluster import LocalCluster

PARTITIONS = 12
#: Checks created per create_many call of the million (the definitions of one batch are held
#: in memory at once).
CREATE_BATCH = 50_000
#: The instant the million checks are created at (their first ticks spread over the period
#: after it) and the tick runs from.
T0 = 1_780_000_000.0


def _masters(cluster: LocalCluster) -> dict[int, redis.Redis]:
    return {node.port: node.client() for node in cluster.nodes}


def _master_of_partition(cluster: LocalCluster) -> list[int]:
    """The port of the master holding each partition."""
    return [
        cluster.node_of_slot(key_slot(tag.strip("{}").encode())).port
        for tag in partition_tags(PARTITIONS)
    ]


def _used_memory(clients: dict[int, redis.Redis]) -> dict[int, int]:
    for client in clients.values():
        client.execute_command("MEMORY", "PURGE")
    return {port: int(c.info("memory")["used_memory"]) for port, c in clients.items()}


def _idle_cpu_per_s(clients: dict[int, redis.Redis], seconds: float = 1.0) -> dict[int, float]:
    meters = {port: ServerMeter(c) for port, c in clients.items()}
    time.sleep(seconds)
    return {port: m.delta()[2] / seconds for port, m in meters.items()}


def _definitions(settings: Any, first: int, count: int) -> list[Any]:
    return [
        validate_definition(
            settings,
            uid=f"c{i:07d}",
            tenant=f"t{i % 500}",
            kind=BENCH_KIND,
            target=f"https://e{i % 1000}.test/",
            period=60,
            regions=[REGION],
        )
        for i in range(first, first + count)
    ]


def _per_run(
    app: Any, state: Any, settings: Any, cluster: LocalCluster, checks: int, out: Any
) -> dict[str, Any]:
    """Every check run twice on spare slots, the second round measured on each master."""
    keys = state_keys(settings)
    clients = _masters(cluster)
    owner = _master_of_partition(cluster)
    store = CheckStore(state, keys, settings)
    store.create_many(_definitions(settings, 0, checks), now=from_unix(time.time() - 120))
    for part in keys.every_partition():
        register_capacity(state, part, WORKER, REGION, checks)
    dispatchers = [Dispatcher(app, client=state, partition=p) for p in range(PARTITIONS)]
    consumer = RunConsumer(app, Params.from_settings(settings))
    try:
        for dispatcher in dispatchers:
            dispatcher.tick(time.time())
        if _run_all(app, state, keys, consumer, checks) != checks:
            raise RuntimeError("the first round did not run every check")
        for part in keys.every_partition():
            ids = state.zrange(part.due(), 0, -1)
            if ids:
                state.zadd(part.due(), dict.fromkeys(ids, time.time() - 1))
        idle = _idle_cpu_per_s(clients)
        meters = {port: ServerMeter(c) for port, c in clients.items()}
        started = time.perf_counter()
        for dispatcher in dispatchers:
            dispatcher.tick(time.time())
        runs = _run_all(app, state, keys, consumer, checks)
        wall_s = time.perf_counter() - started
    finally:
        consumer.close()
    runs_on = Counter(owner[partition_of(f"c{i:07d}", PARTITIONS)] for i in range(checks))
    masters: dict[str, dict[str, Any]] = {}
    for port, meter in meters.items():
        calls, _net, cpu = meter.delta()
        cpu = max(1e-9, cpu - idle[port] * wall_s)
        served = runs_on[port]
        masters[str(port)] = {
            "partitions": owner.count(port),
            "runs": served,
            "commands": sum(calls.values()),
            "commands_per_run": sum(calls.values()) / served,
            "cpu_us": cpu * 1e6,
            "cpu_us_per_run": cpu / served * 1e6,
            "top_commands_per_run": {k: v / served for k, v in calls.most_common(8)},
        }
    cpus = [m["cpu_us"] for m in masters.values()]
    result = {
        "runs": runs,
        "masters": masters,
        "balance": max(cpus) / (sum(cpus) / len(cpus)),
        "cluster_commands_per_run": sum(m["commands"] for m in masters.values()) / runs,
        "cluster_cpu_us_per_run": sum(cpus) / runs,
    }
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(
        f"per run: {runs:,} second runs of {checks:,} checks (one region, period 60 s) in "
        f"{PARTITIONS} partitions on {len(masters)} masters, spare slots"
    )
    for port, m in masters.items():
        top = ", ".join(f"{k} {v:.2f}" for k, v in m["top_commands_per_run"].items())
        p(
            f"  master :{port}: {m['partitions']} partitions, {m['runs']:,} runs, "
            f"{m['commands_per_run']:.1f} commands and {m['cpu_us_per_run']:.0f} us of CPU "
            f"per run ({m['cpu_us'] / 1000:.0f} ms in all)\n    {top}"
        )
    p(
        f"  cluster: {result['cluster_commands_per_run']:.1f} commands, "
        f"{result['cluster_cpu_us_per_run']:.0f} us of Redis CPU per run; balance (busiest "
        f"master's CPU / mean) {result['balance']:.2f} (target <= 1.3)"
    )
    for client in clients.values():
        client.close()
    return result


def _one_tick(
    app: Any, state: Any, settings: Any, cluster: LocalCluster, checks: int, window: float,
    broker: redis.Redis, out: Any,
) -> dict[str, Any]:  # fmt: skip
    """``checks`` checks created across the cluster, then one beat tick over every partition."""
    keys = state_keys(settings)
    clients = _masters(cluster)
    store = CheckStore(state, keys, settings)
    before = _used_memory(clients)
    started = time.perf_counter()
    for first in range(0, checks, CREATE_BATCH):
        count = min(CREATE_BATCH, checks - first)
        store.create_many(_definitions(settings, first, count), now=from_unix(T0))
        print(f"  created {first + count:,} of {checks:,} checks", file=sys.stderr)
    create_s = time.perf_counter() - started
    after = _used_memory(clients)
    jobs = checks  # one region
    owner = _master_of_partition(cluster)
    jobs_on = Counter(owner[partition_of(f"c{i:07d}", PARTITIONS)] for i in range(checks))
    memory = {str(port): (after[port] - before[port]) / jobs_on[port] for port in clients}
    for part in keys.every_partition():
        register_capacity(state, part, "bench-tick", REGION, jobs)
    dispatchers = [Dispatcher(app, client=state, partition=p) for p in range(PARTITIONS)]
    broker.flushdb()
    started = time.perf_counter()
    reports = [dispatcher.tick(T0 + window) for dispatcher in dispatchers]
    tick_s = time.perf_counter() - started
    published = sum(r.published for r in reports)
    queued = sum(broker.llen(q) for q in broker.keys("checks.*"))
    if queued != published:
        raise RuntimeError(f"{published} published but {queued} queued")
    result = {
        "checks": checks,
        "jobs": jobs,
        "create_s": create_s,
        "bytes_per_job": sum(after.values()) / jobs - sum(before.values()) / jobs,
        "bytes_per_job_on_master": memory,
        "jobs_on_master": {str(port): n for port, n in jobs_on.items()},
        "window_s": window,
        "published": published,
        "published_per_partition": [r.published for r in reports],
        "tick_s": tick_s,
        "jobs_per_s": published / tick_s,
    }
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\none beat tick: {checks:,} checks ({jobs:,} jobs) across the cluster")
    p(
        f"  created in {create_s:.0f} s ({jobs / create_s:,.0f} jobs/s); used_memory per job "
        f"{result['bytes_per_job']:,.0f} B (per master: "
        + ", ".join(f":{port} {b:,.0f} B" for port, b in memory.items())
        + ")"
    )
    p(
        f"  the tick at +{window:g} s: {published:,} jobs due and published in "
        f"{tick_s:.2f} s = {result['jobs_per_s']:,.0f} jobs/s (12 dispatchers, one after "
        f"the other, as one beat runs them)"
    )
    for client in clients.values():
        client.close()
    return result


def run(quick: bool, checks: int | None, window: float, out: Any) -> dict[str, Any]:
    """Both measures, each on a fresh cluster."""
    check_kind(BENCH_KIND)(lambda target, config: True)
    figures: dict[str, Any] = {}
    run_checks = 1_200 if quick else 6_000
    tick_checks = checks or (20_000 if quick else 1_000_000)
    for name in ("per_run", "tick"):
        root = Path(tempfile.mkdtemp(prefix="checkbeat-cluster-"))
        cluster = LocalCluster(root).start()
        try:
            settings = load_settings(
                redis_url=cluster.url(),
                broker_url=cluster.broker_url(),
                key_prefix="cb",
                regions=[REGION],
                check_partitions=PARTITIONS,
            )
            app = create_app(settings)
            state = get_redis(settings.redis_url, settings)
            if name == "per_run":
                figures[name] = _per_run(app, state, settings, cluster, run_checks, out)
            else:
                broker = redis.Redis.from_url(settings.effective_broker_url)
                figures[name] = _one_tick(
                    app, state, settings, cluster, tick_checks, window, broker, out
                )
                broker.close()
        finally:
            reset_clients()
            cluster.stop()
    return figures
