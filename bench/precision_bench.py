"""Precision bench: how close to its tick a check starts, and what a run costs the worker.

Reproduce (from the repository root; starts its own redis-server, HTTP target, beat, workers)::

    python -m bench.precision_bench              # spare (~30 runs/s) and near capacity (~150/s)
    python -m bench.precision_bench --quick      # smoke: a few seconds, one small load
    python -m bench.precision_bench --scale 0.5  # a loaded machine: half the checks

Two systems, one after the other, same instant HTTP target on 127.0.0.1 (``/delay/0``), same
slots (one threads worker of ``--slots`` threads), task events on in both:

- **checkbeat**: the checks created in the check store, a real ``celery beat`` (its dispatcher)
  and one ``--role shared`` worker; starts and ticks come from the results stream.
- **plain Celery**: a producer in this process sends ``bench.get`` (one GET with one httpx
  client shared by the worker's threads, ``bench/plain_app.py``) at each tick, the same phases
  (the uid jitter) and period.
- with ``--anchor kept``, instead of plain Celery: **plain + state**, the same producer sending
  ``bench.get_kept``: ``bench.get`` plus the least per-run state any lease-checked runner keeps,
  written by hand (one read before the probe: the job's lease, Redis's time, a first-delivery
  marker; one guarded Lua write after it). What checkbeat's own bookkeeping costs beyond that
  floor is checkbeat's to cut; what the floor costs over plain Celery is the price of keeping
  state at all.

Start lateness = probe start minus the tick (both on this machine's clock); an early start is a
start before its tick (must be 0); a tick due in the window that never started is "missed".
Worker CPU per run = the worker process's user+system CPU (``/proc``) over the runs it made,
both systems running their ticks to the end of the drain (the same runs in each window);
"+ sender" adds what sends the runs: checkbeat's beat process, plain Celery's producer thread
(checkbeat's worker refills the slot it frees, dispatching work a plain producer does outside it).

``--repeat N`` runs each load N times, the systems alternated, prints each round's table and
then, per metric, the median of each system and the median and range of the rounds' ratios.
Why: on this shared 2-core VM the same code gives worker-CPU ratios from 1.05x to 1.41x and p90s
from 5 to 25 ms run to run, so one round cannot show a change of 10%; compare medians of five
or more rounds, alternated with the other commit's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench import plain_app
from bench.figures import command_line
from bench.overload_bench import REPO, Worker, base_env, percentile
from celery_app.local.embedded_redis import RedisServer
from scheduling_core import first_aligned
from tests.support.alternated_rounds import ratio, summarize
from tests.support.http_target import DelayServer
from tests.support.polling import wait_for

TARGET = "/delay/0"
WARMUP_S = 1.0  # ticks in the first second are left out (processes settle)
TAIL_S = 0.5  # ticks in the last half second may not have started yet by the end
DRAIN_S = 1.5


@dataclass(frozen=True)
class Load:
    name: str
    checks: int
    period_s: int
    duration_s: float

    @property
    def rate(self) -> float:
        return self.checks / self.period_s

    def uids(self) -> list[str]:
        return [f"p-{i:05d}" for i in range(self.checks)]

    def created_at(self, index: int, t0: float) -> float:
        """When check ``index`` is created: spread over the second after ``t0`` (golden-ratio
        steps, whole ms), as checks created at different moments are. Created at one instant,
        every tick would share its sub-second and all checks would start in bursts once a
        second (``next_aligned`` carries the creation's sub-second part)."""
        return t0 + round((index * 0.6180339887) % 1.0, 3)

    def first_tick(self, uid: str, now: float) -> float:
        """checkbeat's first tick of ``uid`` created at ``now`` (``first_aligned``: the phase
        floored to whole seconds, now's sub-second part carried over)."""
        period = timedelta(seconds=self.period_s)
        start = datetime.fromtimestamp(now, UTC)
        return first_aligned(
            start, period, period, uid, "local", ["local"], timedelta(0)
        ).timestamp()


SPARE = Load("spare", checks=150, period_s=5, duration_s=15.0)  # 30 runs/s
NEAR = Load("near", checks=750, period_s=5, duration_s=15.0)  # 150 runs/s
QUICK = Load("quick", checks=20, period_s=2, duration_s=5.0)


@dataclass
class Result:
    system: str
    lateness_ms: list[float]
    early: int
    missed: int
    runs: int
    cpu_s: float
    #: The worker's CPU plus the CPU of what sends its runs (checkbeat's beat; plain Celery's
    #: producer thread): checkbeat's worker does part of the dispatching (the refill of the slot
    #: it frees) that a plain producer does elsewhere, so both views are printed.
    with_sender_cpu_s: float = float("nan")

    def row(self) -> dict[str, float]:
        late = self.lateness_ms
        return {
            "start late p50 ms": percentile(late, 50),
            "start late p90 ms": percentile(late, 90),
            "start late p99 ms": percentile(late, 99),
            "start late max ms": max(late, default=float("nan")),
            "early starts": self.early,
            "missed ticks": self.missed,
            "runs": self.runs,
            "worker CPU per run ms": 1000.0 * self.cpu_s / self.runs if self.runs else float("nan"),
            "+ sender CPU per run ms": (
                1000.0 * self.with_sender_cpu_s / self.runs if self.runs else float("nan")
            ),
        }


# --- measurement helpers ------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a prefork pool's children count as the worker's CPU)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def thread_cpu_seconds() -> float:
    """User + system CPU of the calling thread (the plain producer's send loop), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its descendants, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


Tick = tuple[str, float]  # (uid, tick rounded to the ms)


def judge(system: str, ticks: list[Tick], starts: dict[Tick, float], cpu_s: float, runs: int,
          t0: float, end: float) -> Result:  # fmt: skip
    """Lateness of every tick due in [t0 + warmup, end - tail]; ``starts`` maps a tick to its
    start."""
    late, early, missed = [], 0, 0
    for key in set(ticks):
        tick = key[1]
        if not (t0 + WARMUP_S <= tick < end - TAIL_S):
            continue
        start = starts.get(key)
        if start is None:
            missed += 1
            continue
        if start < tick:
            early += 1
        late.append(max(0.0, start - tick) * 1000.0)
        if os.environ.get("PRECISION_DEBUG") and start - tick > 0.05:
            print(f"late {system}: tick {tick - t0:.3f} start {start - t0:.3f}")
    return Result(system, late, early, missed, runs, cpu_s)


class Beat:
    """``celery -A celery_app beat`` as a subprocess, logged to a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "beat", "-l", "INFO"],
            cwd=REPO,
            env=env,
            stdout=self._file,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._file.close()


def profile(pid: int, out: Path | None, seconds: float) -> subprocess.Popen | None:
    """``py-spy record`` of the worker's threads for ``seconds`` into ``out`` (raw, collapsed
    stacks), when ``--profile`` asked for it: where a run's CPU goes."""
    if out is None:
        return None
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--gil",
         "--nonblocking", "--duration", str(int(seconds)), "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


# --- checkbeat ----------------------------------------------------------------------------------


def run_checkbeat(
    load: Load,
    slots: int,
    server: DelayServer,
    redis_server: RedisServer,
    logs: Path,
    profile_dir: Path | None = None,
    settings_env: Sequence[tuple[str, str]] = (),
) -> Result:
    from celery_app.checks.definition import validate_definition
    from celery_app.checks.store import CheckStore
    from celery_app.factory import create_app
    from celery_app.redis.clock import server_time
    from celery_app.redis.schema import Keys
    from celery_app.settings import load_settings

    broker_url, state_url = redis_server.url(0), redis_server.url(1)
    redis.Redis.from_url(broker_url).flushdb()
    state = redis.Redis.from_url(state_url, decode_responses=True)
    state.flushdb()
    knobs = {
        "CHECKBEAT_REDIS_URL": state_url,
        "CHECKBEAT_BROKER_URL": broker_url,
        "CHECKBEAT_KEY_PREFIX": "precision",
        "CHECKBEAT_REGIONS": "local",
        "CHECKBEAT_POOL_SIZE": str(slots),
        "CHECKBEAT_FAST_LANE_RESERVED": "0",
        "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",
        "CHECKBEAT_RESULTS_HISTORY": "1000",
        **dict(settings_env),
    }
    settings = load_settings(
        redis_url=state_url,
        broker_url=broker_url,
        key_prefix="precision",
        regions=["local"],
        pool_size=slots,
        fast_lane_reserved=0,
        allow_private_targets=True,
        results_history=1000,
    )
    app = create_app(settings)
    app.loader.import_default_modules()  # the built-in kinds
    keys = Keys(settings.key_prefix)
    env = base_env(**knobs)
    worker = Worker(
        "celery_app", ["--role", "shared", "-n", "shared@precision", "-E"], env,
        logs / f"checkbeat-{load.name}.log",
    )  # fmt: skip
    beat: Beat | None = None
    try:
        worker.wait_ready()
        beat = Beat(env, logs / f"beat-{load.name}.log")
        wait_for(lambda: state.hlen(keys.beat_heartbeat()) > 0, 60, 0.05, what="beat to start")
        store = CheckStore(state, keys, settings)
        definitions = [
            validate_definition(
                settings, uid=uid, tenant="bench", kind="http", target=server.url(TARGET),
                period=load.period_s,
            )
            for uid in load.uids()
        ]  # fmt: skip
        cpu0 = cpu_seconds(worker.process.pid)
        spy = profile(
            worker.process.pid,
            profile_dir and profile_dir / f"checkbeat-{load.name}.txt",
            load.duration_s,
        )
        beat_cpu0 = cpu_seconds(beat.process.pid)
        t0 = server_time(state)
        batches: dict[float, list] = {}
        for i, definition in enumerate(definitions):
            batches.setdefault(load.created_at(i, t0), []).append(definition)
        for at, batch in sorted(batches.items()):
            store.create_many(batch, now=datetime.fromtimestamp(at, UTC))
        end = t0 + load.duration_s
        time.sleep(max(0.0, end + DRAIN_S - server_time(state)))
        cpu_s = cpu_seconds(worker.process.pid) - cpu0
        beat_cpu_s = cpu_seconds(beat.process.pid) - beat_cpu0
        if spy is not None:
            spy.wait(30)
        beat.stop()
        pipe = state.pipeline(transaction=False)
        for uid in load.uids():
            pipe.xrange(keys.results(uid))
        ticks: list[Tick] = []
        starts: dict[Tick, float] = {}
        runs = 0
        for uid, entries in zip(load.uids(), pipe.execute(), strict=True):
            for _id, fields in entries:
                record = json.loads(fields["result"])
                runs += 1
                key = (uid, round(datetime.fromisoformat(record["scheduled_at"]).timestamp(), 3))
                ticks.append(key)
                if record.get("started_at"):
                    started = datetime.fromisoformat(record["started_at"]).timestamp()
                    if started <= end:
                        starts[key] = started
        # Jobs whose current tick is due in the window but has not started: missed ticks.
        pipe = state.pipeline(transaction=False)
        for uid in load.uids():
            pipe.hmget(keys.job(f"{uid}@local"), "sa", "lt")
        for uid, (sa, lease) in zip(load.uids(), pipe.execute(), strict=True):
            if sa and not lease:
                ticks.append((uid, round(float(sa), 3)))
    finally:
        if beat is not None:
            beat.stop()
        worker.stop()
    return replace(
        judge("checkbeat", ticks, starts, cpu_s, runs, t0, end),
        with_sender_cpu_s=cpu_s + beat_cpu_s,
    )


# --- plain Celery -------------------------------------------------------------------------------


#: The anchors ``--anchor`` picks from: the system's name in the table, and its task.
ANCHORS = {
    "plain": (plain_app.PLAIN_NAME, "bench.get"),
    "kept": (plain_app.KEPT_NAME, "bench.get_kept"),
}


def run_plain(
    load: Load,
    slots: int,
    server: DelayServer,
    redis_server: RedisServer,
    logs: Path,
    profile_dir: Path | None = None,
    anchor: str = "plain",
) -> Result:
    broker_url, state_url = redis_server.url(0), redis_server.url(1)
    redis.Redis.from_url(broker_url).flushdb()
    state = redis.Redis.from_url(state_url)
    state.flushdb()
    env = base_env(BENCH_BROKER_URL=broker_url, BENCH_STATE_URL=state_url)
    worker = Worker(
        "bench.plain_app", ["-Q", "checks", "-c", str(slots), "-n", "plain@precision", "-E"], env,
        logs / f"{anchor}-{load.name}.log",
    )  # fmt: skip
    producer = Celery("bench-producer", broker=broker_url)
    producer.conf.update(
        task_serializer="json", broker_connection_retry_on_startup=True, task_send_sent_event=True
    )
    url = server.url(TARGET)
    try:
        worker.wait_ready()
        cpu0 = cpu_seconds(worker.process.pid)
        spy = profile(
            worker.process.pid,
            profile_dir and profile_dir / f"{anchor}-{load.name}.txt",
            load.duration_s,
        )
        t0 = time.time()
        end = t0 + load.duration_s
        # The instants checkbeat would run them at (its own phases), sent when due. Sent on
        # through the drain, as checkbeat's checks keep running then: both CPU windows hold
        # the same runs (judged: only the ticks before ``end``).
        stop = end + DRAIN_S
        ticks = sorted(
            (load.first_tick(uid, load.created_at(i, t0)) + k * load.period_s, uid)
            for i, uid in enumerate(load.uids())
            for k in range(int((stop - t0) // load.period_s) + 1)
        )
        ticks = [(at, uid) for at, uid in ticks if at < stop]
        system, task = ANCHORS[anchor]
        if anchor == "kept":  # every tick's lease, as a claim would have written it
            leases = state.pipeline(transaction=False)
            for i in range(len(ticks)):
                leases.hset(plain_app.kept_job(f"t{i}"), "lease", f"t{i}")
            leases.execute()
        sender_cpu0 = thread_cpu_seconds()
        with producer.connection_for_write() as conn:
            for i, (at, _uid) in enumerate(ticks):
                time.sleep(max(0.0, at - time.time()))
                args = [f"t{i}", url, at]
                if anchor == "kept":
                    args = [f"t{i}", f"t{i}", url, at, load.period_s]
                producer.send_task(task, args=args, queue="checks", connection=conn)
        sender_cpu_s = thread_cpu_seconds() - sender_cpu0
        time.sleep(max(0.0, stop - time.time()))
        cpu_s = cpu_seconds(worker.process.pid) - cpu0
        if spy is not None:
            spy.wait(30)
        records = [json.loads(r) for r in state.lrange("bench:runs", 0, -1)]
    finally:
        worker.stop()
    keys = [(uid, round(at, 3)) for at, uid in ticks]
    starts = {keys[int(r["id"][1:])]: r["started_at"] for r in records if r["started_at"] <= end}
    return replace(
        judge(system, keys, starts, cpu_s, len(records), t0, end),
        with_sender_cpu_s=cpu_s + sender_cpu_s,
    )


# --- report -------------------------------------------------------------------------------------


def print_table(load: Load, slots: int, results: dict[str, Result]) -> dict[str, dict]:
    """One round's table: checkbeat, then each anchor, then checkbeat's ratio to each anchor."""
    rows = {name: result.row() for name, result in results.items()}
    anchors = [name for name in rows if name != "checkbeat"]
    print()
    print(
        f"load {load.name}: {load.checks} checks every {load.period_s} s = {load.rate:g} runs/s "
        f"for {load.duration_s:g} s, {slots} slots, target {TARGET} on 127.0.0.1"
    )
    header = "".join(f"{results[name].system:>15}" for name in rows)
    ratio_header = "".join(f"{'/ ' + results[name].system:>17}" for name in anchors)
    print(f"{'metric':<26}{header}{ratio_header}")
    for metric in rows["checkbeat"]:
        values = "".join(f"{rows[name][metric]:>15.2f}" for name in rows)
        ratios = "".join(
            f"{ratio(rows['checkbeat'][metric], rows[name][metric]):>16.2f}x" for name in anchors
        )
        print(f"{metric:<26}{values}{ratios}")
    return rows


def print_summary(load: Load, summary: dict[str, Any]) -> None:
    print()
    print(f"load {load.name}: medians of {len(summary['rounds'])} alternated rounds")
    for system, ratios in summary["ratios"].items():
        name = ANCHORS[system][0]
        print(f"{'metric':<26}{'checkbeat':>12}{name:>15}{'ratio':>9}{'ratio range':>17}")
        for metric, (median, low, high) in ratios.items():
            ours, theirs = summary["checkbeat"][metric], summary[system][metric]
            span = f"{low:.2f}-{high:.2f}x"
            print(f"{metric:<26}{ours:>12.2f}{theirs:>15.2f}{median:>8.2f}x{span:>17}")


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for the smoke test")
    parser.add_argument("--only", choices=["spare", "near"], action="append")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of checks")
    parser.add_argument("--duration", type=float, help="seconds per system and load")
    parser.add_argument("--profile", type=Path, help="py-spy the workers into this directory")
    parser.add_argument("--slots", type=int, default=8, help="worker threads (both systems)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per load, alternated; medians printed"
    )
    parser.add_argument(
        "--anchor",
        choices=list(ANCHORS),
        action="append",
        help="what checkbeat is compared with (repeatable; default plain): plain Celery's task, "
        "or kept, that task plus the least per-run state a lease-checked runner keeps, written "
        "by hand (bench.get_kept)",
    )
    parser.add_argument(
        "--checkbeat-env",
        metavar="CHECKBEAT_NAME=VALUE",
        action="append",
        default=[],
        help="a setting for checkbeat's worker and beat (repeatable), e.g. "
        "CHECKBEAT_DISPATCH_LEAD=0; the bench's own settings are kept unless named",
    )
    args = parser.parse_args(argv)
    settings_env = []
    for item in args.checkbeat_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("CHECKBEAT_"):
            parser.error(f"--checkbeat-env takes CHECKBEAT_NAME=VALUE, not {item!r}")
        settings_env.append((name, value))
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    anchors = list(dict.fromkeys(args.anchor or ["plain"]))
    if args.quick:
        loads = [QUICK]
    else:
        loads = [load for load in (SPARE, NEAR) if not args.only or load.name in args.only]
    loads = [
        replace(
            load,
            checks=max(1, round(load.checks * args.scale)),
            duration_s=args.duration or load.duration_s,
        )
        for load in loads
    ]
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="checkbeat-precision-") as tmp:
        logs = Path(tmp)
        redis_server = RedisServer(logs / "redis").start()
        try:
            with DelayServer() as server:
                for load in loads:
                    rounds = []
                    for _ in range(args.repeat):
                        run = (load, args.slots, server, redis_server, logs, args.profile)
                        results = {"checkbeat": run_checkbeat(*run, settings_env)}
                        for anchor in anchors:
                            results[anchor] = run_plain(*run, anchor=anchor)
                        rounds.append(print_table(load, args.slots, results))
                    out[load.name] = {"load": asdict(load), **summarize(rounds)}
                    if len(rounds) > 1:
                        print_summary(load, out[load.name])
        finally:
            redis_server.stop()
    return out


if __name__ == "__main__":
    command_line(main)
