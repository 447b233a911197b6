"""Overload bench: fast checks behind slow ones, plain Celery vs checkbeat's learned lanes.

Reproduce (from the repository root; starts its own redis-server, HTTP target and workers)::

    python -m bench.overload_bench            # full: 200 x 50 ms + 40 x 3 s checks every 10 s, 90 s
    python -m bench.overload_bench --quick    # smoke: a few seconds
    python -m bench.overload_bench --duration 120

One machine, one workload, the three systems one after the other, 8 probe slots each:

(a) plain Celery, one queue, one worker with 8 threads, a producer that sends every check at
    its tick (phases = checkbeat's jitter of the check's uid, so the arrival pattern is the same);
(b) plain Celery, two hand-routed queues: fast checks to ``fast``, slow ones to ``slow``; a
    fast-only worker with 2 slots and a shared worker with 6 slots consuming both;
(c) checkbeat: the same checks created in the check store, ``--role fast`` (2) and
    ``--role shared`` (6) workers, the dispatcher ticking as beat runs it. Nobody says which
    check is slow: the lanes are learned from the measured cost.

The workload asks for 200 x 0.05 + 40 x 3 = 130 slot-seconds every 10 s of 80 available: slow
work alone exceeds the shared slots, so every system is overloaded. Lateness = probe start minus
the tick it was due at; a tick that never started by the end counts as late by (end - tick).
"Settled" leaves out the first three periods: checkbeat learns the lanes in the first (every new
check starts fast, so the 40 slow ones take all 8 slots once) and drains the fast ticks that
waited behind them in the second. The per-period on-time row shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench.figures import command_line
from celery_app.local.embedded_redis import RedisServer
from scheduling_core import jitter_for
from tests.support.http_target import DelayServer

REPO = Path(__file__).resolve().parent.parent
ON_TIME_S = 1.0


@dataclass(frozen=True)
class Workload:
    fast: int
    slow: int
    fast_ms: int
    slow_ms: int
    period_s: int
    duration_s: float
    pool: int = 8
    reserved: int = 2

    @property
    def settle_s(self) -> float:
        """Every slow check has run once (its lane is learned) and the fast ticks that waited
        behind those first slow runs have drained: three periods."""
        return 3.0 * self.period_s

    def checks(self) -> list[tuple[str, str, str]]:
        """(uid, kind, path) of every check."""
        fast = [(f"fast-{i:03d}", "fast", f"/delay/{self.fast_ms}") for i in range(self.fast)]
        slow = [(f"slow-{i:03d}", "slow", f"/delay/{self.slow_ms}") for i in range(self.slow)]
        return fast + slow

    def phase(self, uid: str) -> float:
        return jitter_for(uid, timedelta(seconds=self.period_s)).total_seconds()


FULL = Workload(fast=200, slow=40, fast_ms=50, slow_ms=3000, period_s=10, duration_s=90)
QUICK = Workload(fast=12, slow=3, fast_ms=20, slow_ms=600, period_s=2, duration_s=4)


@dataclass(frozen=True)
class Run:
    kind: str
    scheduled_at: float
    started_at: float | None  # None: never started within the window
    finished_at: float | None = None


@dataclass
class SystemReport:
    name: str
    t0: float
    end: float
    runs: list[Run]
    depth: list[tuple[float, int]] = field(default_factory=list)

    def lateness(self, kind: str, since: float = 0.0, until: float | None = None) -> list[float]:
        until = self.end - ON_TIME_S if until is None else until
        out = []
        for run in self.runs:
            if run.kind != kind or not (self.t0 + since <= run.scheduled_at < until):
                continue
            start = run.started_at if run.started_at is not None else self.end
            out.append(max(0.0, start - run.scheduled_at))
        return out

    def completed(self, kind: str) -> int:
        return sum(
            1
            for run in self.runs
            if run.kind == kind and run.finished_at is not None and run.finished_at <= self.end
        )


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def on_time(values: Sequence[float]) -> float:
    return 100.0 * sum(v < ON_TIME_S for v in values) / len(values) if values else float("nan")


# --- processes ------------------------------------------------------------------------------


class Worker:
    """A celery worker subprocess, logged to a file; stop() is a warm shutdown."""

    def __init__(self, app: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._file = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                "-P",
                "threads",
                "-l",
                "INFO",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                *args,
            ],
            cwd=REPO,
            env=env,
            stdout=self._file,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._file.close()


class DepthSampler:
    """Samples the broker queue lengths (messages waiting in Celery) every ``interval``."""

    def __init__(self, client: redis.Redis, queues: Sequence[str], interval: float) -> None:
        self.client, self.queues, self.interval = client, list(queues), interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.llen(queue)
            self.samples.append((time.time(), sum(pipe.execute())))
            self._stop.wait(self.interval)

    def __enter__(self) -> DepthSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKBEAT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


# --- (a) and (b): plain Celery ---------------------------------------------------------------


def run_plain(
    name: str,
    routed: bool,
    workload: Workload,
    server: DelayServer,
    redis_server: RedisServer,
    logs: Path,
) -> SystemReport:
    broker_url, state_url = redis_server.url(0), redis_server.url(1)
    redis.Redis.from_url(broker_url).flushdb()
    state = redis.Redis.from_url(state_url)
    state.flushdb()
    env = base_env(BENCH_BROKER_URL=broker_url, BENCH_STATE_URL=state_url)
    if routed:
        shape = [
            ("fast", workload.reserved, "fast"),
            ("shared", workload.pool - workload.reserved, "fast,slow"),
        ]
        queues = ["fast", "slow"]
    else:
        shape, queues = [("all", workload.pool, "checks")], ["checks"]
    workers = [
        Worker(
            "bench.plain_app",
            ["-Q", q, "-c", str(c), "-n", f"{n}@{name}"],
            env,
            logs / f"{name}-{n}.log",
        )
        for n, c, q in shape
    ]
    producer = Celery("bench-producer", broker=broker_url)
    producer.conf.update(task_serializer="json", broker_connection_retry_on_startup=True)
    try:
        for worker in workers:
            worker.wait_ready()
        t0 = time.time()
        end = t0 + workload.duration_s
        ticks = sorted(
            (t0 + workload.phase(uid) + k * workload.period_s, uid, kind, path)
            for uid, kind, path in workload.checks()
            for k in range(int(workload.duration_s // workload.period_s) + 1)
        )
        produced: dict[str, tuple[str, float]] = {}
        with DepthSampler(redis.Redis.from_url(broker_url), queues, 0.5) as sampler:
            with producer.connection_for_write() as conn:
                for i, (at, uid, kind, path) in enumerate(ticks):
                    if at >= end:
                        break
                    time.sleep(max(0.0, at - time.time()))
                    tick_id = f"t{i}"
                    produced[tick_id] = (kind, at)
                    queue = ("fast" if kind == "fast" else "slow") if routed else "checks"
                    producer.send_task(
                        "bench.probe",
                        args=[tick_id, uid, kind, server.url(path), at],
                        queue=queue,
                        connection=conn,
                    )
            time.sleep(max(0.0, end - time.time()))
        records = {r["id"]: r for r in map(json.loads, state.lrange("bench:runs", 0, -1))}
    finally:
        for worker in workers:
            worker.stop()
    runs = []
    for tick_id, (kind, at) in produced.items():
        record = records.get(tick_id)
        started = record["started_at"] if record and record["started_at"] <= end else None
        runs.append(Run(kind, at, started, record["finished_at"] if record else None))
    return SystemReport(name, t0, end, runs, sampler.samples)


# --- (c): checkbeat ----------------------------------------------------------------------------


def run_checkbeat(
    workload: Workload,
    server: DelayServer,
    redis_server: RedisServer,
    logs: Path,
    tick_s: float = 0.25,
) -> SystemReport:
    from celery_app.settings import get_settings

    broker_url, state_url = redis_server.url(0), redis_server.url(1)
    redis.Redis.from_url(broker_url).flushdb()
    state = redis.Redis.from_url(state_url, decode_responses=True)
    state.flushdb()
    knobs = {
        "CHECKBEAT_REDIS_URL": state_url,
        "CHECKBEAT_BROKER_URL": broker_url,
        "CHECKBEAT_KEY_PREFIX": "bench",
        "CHECKBEAT_REGIONS": "local",
        "CHECKBEAT_POOL_SIZE": str(workload.pool),
        "CHECKBEAT_FAST_LANE_RESERVED": str(workload.reserved),
        "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",
        "CHECKBEAT_RESULTS_HISTORY": "10000",
    }
    saved_env = dict(os.environ)
    os.environ.update(knobs)  # this process creates the checks and runs the dispatcher
    get_settings.cache_clear()
    try:
        return _run_checkbeat(workload, server, logs, tick_s, knobs, broker_url, state)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        get_settings.cache_clear()


def _run_checkbeat(
    workload: Workload,
    server: DelayServer,
    logs: Path,
    tick_s: float,
    knobs: dict[str, str],
    broker_url: str,
    state: redis.Redis,
) -> SystemReport:
    from celery_app.checks.definition import validate_definition
    from celery_app.checks.dispatch import Dispatcher
    from celery_app.checks.store import CheckStore
    from celery_app.factory import create_app
    from celery_app.redis.schema import Keys, ResultField, check_queue
    from celery_app.settings import load_settings

    settings = load_settings()
    app = create_app(settings)
    app.loader.import_default_modules()
    keys = Keys(settings.key_prefix)
    env = base_env(**knobs)
    workers = [
        Worker(
            "celery_app",
            ["--role", role, "-n", f"{role}@checkbeat"],
            env,
            logs / f"checkbeat-{role}.log",
        )
        for role in ("fast", "shared")
    ]
    stop = threading.Event()
    try:
        for worker in workers:
            worker.wait_ready()
        store = CheckStore(state, keys, settings)
        definitions = [
            validate_definition(
                settings,
                uid=uid,
                tenant="bench",
                kind="http",
                target=server.url(path),
                period=workload.period_s,
            )
            for uid, _kind, path in workload.checks()
        ]
        t0 = time.time()
        store.create_many(definitions, now=datetime.fromtimestamp(t0, UTC))
        end = t0 + workload.duration_s
        dispatcher = Dispatcher(app, client=state)

        def dispatch() -> None:
            # As beat runs it; between ticks the workers refill the slots they free.
            while not stop.wait(tick_s):
                dispatcher.tick()

        ticker = threading.Thread(target=dispatch, daemon=True)
        queues = [check_queue("local", "fast"), check_queue("local", "slow")]
        with DepthSampler(redis.Redis.from_url(broker_url), queues, 0.5) as sampler:
            ticker.start()
            time.sleep(max(0.0, end - time.time()))
            stop.set()
            ticker.join(10)
        runs: list[Run] = []
        kinds = {uid: kind for uid, kind, _ in workload.checks()}
        pipe = state.pipeline(transaction=False)
        for uid in kinds:
            pipe.xrange(keys.results(uid))
        for uid, entries in zip(kinds, pipe.execute(), strict=True):
            for _id, fields in entries:
                record = json.loads(fields[ResultField.RECORD])
                if not record.get("started_at"):
                    continue  # a lost run (reaped)
                started = datetime.fromisoformat(record["started_at"]).timestamp()
                finished = datetime.fromisoformat(record["finished_at"]).timestamp()
                scheduled = datetime.fromisoformat(record["scheduled_at"]).timestamp()
                runs.append(
                    Run(kinds[uid], scheduled, started if started <= end else None, finished)
                )
        # Jobs still waiting for a slot (due or ready) are ticks that have not started.
        pipe = state.pipeline(transaction=False)
        for uid in kinds:
            pipe.hmget(keys.job(f"{uid}@local"), "sa", "lt")
        for uid, (sa, lease) in zip(kinds, pipe.execute(), strict=True):
            if sa and not lease and float(sa) < end:
                runs.append(Run(kinds[uid], float(sa), None))
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
    return SystemReport("(c) checkbeat", t0, end, runs, sampler.samples)


# --- report ------------------------------------------------------------------------------------


def summarize(report: SystemReport, workload: Workload) -> dict[str, float]:
    half = workload.duration_s / 2
    fast_all = report.lateness("fast")
    fast_settled = report.lateness("fast", since=workload.settle_s)
    slow_all = report.lateness("slow")
    return {
        "fast on time %": on_time(fast_all),
        "fast on time % (settled)": on_time(fast_settled),
        "fast p50 late s": percentile(fast_all, 50),
        "fast p99 late s": percentile(fast_all, 99),
        "fast p99 late s (settled)": percentile(fast_settled, 99),
        "slow p50 late s": percentile(slow_all, 50),
        "slow p99 late s": percentile(slow_all, 99),
        "slow p99 late s, 1st half": percentile(
            report.lateness("slow", until=report.t0 + half), 99
        ),
        "slow p99 late s, 2nd half": percentile(report.lateness("slow", since=half), 99),
        "fast runs completed": report.completed("fast"),
        "slow runs completed": report.completed("slow"),
        "broker depth max": max((d for _t, d in report.depth), default=0),
        "broker depth at end": report.depth[-1][1] if report.depth else 0,
    }


def depth_timeline(report: SystemReport, step: float) -> str:
    points = []
    t = step
    while t <= report.end - report.t0 + 1e-9:
        before = [d for ts, d in report.depth if ts - report.t0 <= t]
        points.append(str(before[-1] if before else 0))
        t += step
    return " ".join(points)


def on_time_timeline(report: SystemReport, step: float) -> str:
    """Fast on-time % of the ticks due in each period: how (and whether) a system settles."""
    points = []
    since = 0.0
    while since < report.end - report.t0 - ON_TIME_S:
        until = min(report.t0 + since + step, report.end - ON_TIME_S)
        values = report.lateness("fast", since=since, until=until)
        points.append(f"{on_time(values):.0f}" if values else "-")
        since += step
    return " ".join(points)


def print_table(
    reports: list[SystemReport], workload: Workload
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Prints each system's row and returns the rows and each system's ratio to the last one
    (``ratios[name][metric]``)."""
    rows = {r.name: summarize(r, workload) for r in reports}
    ratios_to_last: dict[str, dict[str, float]] = {name: {} for name in list(rows)[:-1]}
    names = [r.name for r in reports]
    metrics = list(next(iter(rows.values())))
    width = max(len(m) for m in metrics) + 2
    col = 16
    print()
    print(
        f"workload: {workload.fast} fast ({workload.fast_ms} ms) + {workload.slow} slow "
        f"({workload.slow_ms} ms) checks every {workload.period_s} s for "
        f"{workload.duration_s:g} s; {workload.pool} slots ({workload.reserved} fast-only); "
        f"on time = started < {ON_TIME_S:g} s late; settled = after {workload.settle_s:g} s"
    )
    header = "".join(n[: col - 1].ljust(col) for n in names)
    ratio_names = [f"{n.split()[0]}/(c)" for n in names[:-1]]
    print("metric".ljust(width) + header + "".join(r.ljust(10) for r in ratio_names))
    for metric in metrics:
        values = [rows[n][metric] for n in names]
        cells = "".join(f"{v:<{col}.2f}" if isinstance(v, float) else f"{v:<{col}}" for v in values)
        base = values[-1]
        ratios = ""
        for name, v in zip(names[:-1], values[:-1], strict=True):
            ratio = v / base if base not in (0, 0.0) and base == base else float("nan")
            ratios += f"{ratio:<10.2f}"
            ratios_to_last[name][metric] = ratio
        print(metric.ljust(width) + cells + ratios)
    print()
    print(f"broker depth over time (every {workload.period_s} s):")
    for report in reports:
        print(f"  {report.name:<28} {depth_timeline(report, workload.period_s)}")
    print(f"fast checks on time, % per period of {workload.period_s} s:")
    for report in reports:
        print(f"  {report.name:<28} {on_time_timeline(report, workload.period_s)}")
    return rows, ratios_to_last


def check_targets(row: dict[str, float], workload: Workload) -> list[str]:
    """checkbeat's targets; returns the ones missed."""
    missed = []
    if not row["fast on time % (settled)"] >= 99.0:
        missed.append(f"fast on time (settled) {row['fast on time % (settled)']:.2f}% < 99%")
    first, second = row["slow p99 late s, 1st half"], row["slow p99 late s, 2nd half"]
    if second > max(1.5 * first, first + workload.period_s):
        missed.append(f"slow p99 lateness grows: {first:.1f} s -> {second:.1f} s")
    if row["broker depth max"] > workload.pool:
        missed.append(f"broker depth {row['broker depth max']} above the {workload.pool} slots")
    return missed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for the smoke test")
    parser.add_argument("--duration", type=float, help="seconds per system (default 90)")
    parser.add_argument("--only", choices=["a", "b", "c"], action="append", help="run a subset")
    parser.add_argument("--tick", type=float, default=0.25, help="checkbeat dispatcher interval")
    args = parser.parse_args(argv)
    workload = QUICK if args.quick else FULL
    if args.duration:
        workload = Workload(**{**workload.__dict__, "duration_s": args.duration})
    only = set(args.only or ["a", "b", "c"])
    with tempfile.TemporaryDirectory(prefix="checkbeat-overload-") as tmp:
        logs = Path(tmp)
        redis_server = RedisServer(logs / "redis").start()
        try:
            with DelayServer() as server:
                reports = []
                if "a" in only:
                    reports.append(
                        run_plain("(a) celery 1 queue", False, workload, server, redis_server, logs)
                    )
                if "b" in only:
                    reports.append(
                        run_plain("(b) celery 2 queues", True, workload, server, redis_server, logs)
                    )
                if "c" in only:
                    reports.append(run_checkbeat(workload, server, redis_server, logs, args.tick))
        finally:
            redis_server.stop()
    rows, ratios = print_table(reports, workload)
    if "c" in only and not args.quick:
        missed = check_targets(rows["(c) checkbeat"], workload)
        print(
            "\ncheckbeat targets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed))
        )
    return {
        "workload": asdict(workload),
        "systems": rows,
        "vs (c)": ratios,
        "broker depth": {r.name: [depth for _, depth in r.depth] for r in reports},
    }


if __name__ == "__main__":
    command_line(main)
