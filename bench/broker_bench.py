"""Broker bench: what one broker Redis spends per check run (publish + delivery), and how many
runs/s one broker core carries, beside plain Celery's broker cost in the same run.

Reproduce (from the repository root, about four minutes; ``--quick`` is a smoke run)::

    .venv/bin/python -m bench.broker_bench
    .venv/bin/python -m bench.broker_bench --repeat 3  # alternated rounds, medians
    .venv/bin/python -m bench.broker_bench --quick

Two private redis-servers: checkbeat's state on one (not measured), the broker on the other,
measured alone. For each task-event mode (on, then off) and each system, one after the other,
the broker flushed between:

- **checkbeat**: ``--workers`` real ``celery -A celery_app worker --role shared`` processes
  (threads pool, ``CHECKBEAT_POOL_SIZE`` slots each), which consume ``checks.<region>.fast`` and
  ``.slow`` without acks as every check worker does (``workers.worker_step``,
  ``redis/kombu_redis.py``). A publisher thread in this process sends ``checkbeat.run_check``
  messages as beat's dispatcher does: built by ``RunMessages`` and published through
  ``make_publisher(app)`` (the production fast path: one LPUSH pipeline per call), one call per
  ``CHECKBEAT_DISPATCH_LEAD`` with the runs that came due meanwhile, one in ten on the slow
  lane. Each message names a stored job whose lease it does not hold, so the task reads its
  start (on the state server) and drops it: the worker does all of a run's broker work (the
  delivery, the task events) and none of a probe's. With events off the workers run
  ``bench.broker_app`` (the same app with ``worker_send_task_events`` off).
- **plain Celery**: ``bench.noop`` (``bench/plain_app.py``) sent with ``send_task`` one message at
  a time, as an application sends tasks (``task_send_sent_event`` with events on), to
  ``--workers`` workers of the same pool and size consuming with acks (kombu's unacked record,
  then the ack after the task: ``plain_app``'s late acks), ``-E`` with events on.

Each rate (100 and 400 runs/s, then ``max``) runs ``--warmup`` seconds, then the broker is
measured over ``--window`` seconds: ``INFO commandstats`` calls, network bytes in + out,
``used_cpu_user + used_cpu_sys`` minus the idle server's (``bench.scale_bench.ServerMeter``).
A run is a message taken off the queues in the window: sent in the window minus the growth of
the queues (``LLEN``, the bench's own, left out of the commands). ``max`` publishes as fast as
the consumers take (the queues topped up to a backlog every tick) to find the ceiling: the
broker core (its CPU near one core), the workers (a backlog left) or the publisher (none
left). Runs per broker core = 1 / broker CPU per run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import Celery

from bench.figures import command_line, refuse_out_of_range
from bench.overload_bench import Worker, base_env
from bench.precision_bench import cpu_seconds
from bench.rounds import median_figures, median_ratios, ratio_cell
from bench.scale_bench import ServerMeter, _idle_cpu_per_s
from celery_app.checks.definition import validate_definition
from celery_app.checks.run_contract import RunMessages
from celery_app.checks.store import CheckStore
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.publish import make_publisher
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import check_queue, job_id
from celery_app.settings import load_settings
from scheduling_core import Params
from tests.support.alternated_rounds import ratio
from tests.support.background import Background
from tests.support.polling import wait_for

REGION = "local"
PLAIN_QUEUE = "plain.checks"
CHECK_QUEUES = (check_queue(REGION, "fast"), check_queue(REGION, "slow"))
#: Stored checks the run messages name (round robin): their jobs exist, their leases do not.
JOBS = 1000
#: Worker threads per worker process, both systems.
SLOTS = 8
#: ``max``: the queues are topped up to this many messages per worker slot every tick.
BACKLOG_PER_SLOT = 8
#: The broker's CPU, in cores, from which ``max`` says the broker is the limit.
SATURATED = 0.9
MAX = "max"


@dataclass(frozen=True)
class Shape:
    rates: tuple[float | str, ...]
    warmup_s: float
    window_s: float
    workers: int


FULL = Shape((100.0, 400.0, MAX), 4.0, 10.0, 2)
QUICK = Shape((100.0, MAX), 2.0, 3.0, 1)


class Feed(Background):
    """Publishes at ``rate`` per second (or, ``max``, tops the queues up to ``backlog``) from a
    thread: every ``tick_s`` the messages due since the last, in one ``send(first, n)`` call when
    ``batched`` (checkbeat's publisher), else one call per message (an application's
    ``send_task``), each counted in :attr:`sent` once it is out."""

    def __init__(
        self,
        send: Callable[[int, int], None],
        batched: bool,
        rate: float | str,
        tick_s: float,
        depth: Callable[[], int],
        backlog: int,
    ) -> None:
        super().__init__("broker-feed", join_s=30)
        self.send, self.batched, self.rate, self.tick_s = send, batched, rate, tick_s
        self.depth, self.backlog = depth, backlog
        self.sent = 0
        self.calls = 0

    def _run(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._stop.is_set():
            if self.rate == MAX:
                n = max(0, self.backlog - self.depth())
            else:
                n = math.floor(float(self.rate) * (time.monotonic() - t0)) - self.sent
            if n > 0 and self.batched:
                self.send(self.sent, n)
                self.sent += n
                self.calls += 1
            for _ in range(n if not self.batched else 0):  # counted as they go out
                self.send(self.sent, 1)
                self.sent += 1
                self.calls += 1
                if self._stop.is_set():
                    return
            k += 1
            self._stop.wait(max(0.0, t0 + k * self.tick_s - time.monotonic()))


class System:
    """One system's publisher and workers on the broker."""

    name: str
    queues: Sequence[str]
    batched: bool
    tick_s: float

    def start_workers(self, events: bool, count: int, logs: Path) -> list[Worker]:
        raise NotImplementedError

    def send(self, first: int, n: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Checkbeat(System):
    name = "checkbeat"
    queues = CHECK_QUEUES
    batched = True

    def __init__(self, state_url: str, broker_url: str) -> None:
        self.settings = load_settings(
            redis_url=state_url,
            broker_url=broker_url,
            key_prefix="bb",
            regions=[REGION],
            pool_size=SLOTS,
            fast_lane_reserved=0,
            redis_wait_replicas=0,
        )
        self.app = create_app(self.settings)
        self.app.loader.import_default_modules()  # the built-in kinds
        self.env = base_env(
            CHECKBEAT_REDIS_URL=state_url,
            CHECKBEAT_BROKER_URL=broker_url,
            CHECKBEAT_KEY_PREFIX="bb",
            CHECKBEAT_REGIONS=REGION,
            CHECKBEAT_POOL_SIZE=str(SLOTS),
            CHECKBEAT_FAST_LANE_RESERVED="0",
        )
        self.messages = RunMessages(Params.from_settings(self.settings))
        self.publisher = make_publisher(self.app)
        self.tick_s = self.settings.dispatch_lead

    def store_jobs(self) -> None:
        """``JOBS`` checks whose first tick is a day away: no refill ever claims one."""
        state = redis.Redis.from_url(self.settings.redis_url, decode_responses=True)
        store = CheckStore(state, state_keys(self.settings), self.settings)
        definitions = [
            validate_definition(
                self.settings, uid=f"b{i:05d}", tenant="bench", kind="http",
                target=f"https://e{i}.test/", period=60, regions=[REGION],
            )
            for i in range(JOBS)
        ]  # fmt: skip
        store.create_many(definitions, now=datetime.now(UTC) + timedelta(days=1))

    def start_workers(self, events: bool, count: int, logs: Path) -> list[Worker]:
        app = "celery_app" if events else "bench.broker_app"
        return [
            Worker(app, ["--role", "shared", "-n", f"cb{i}@broker", "-l", "ERROR"], self.env,
                   logs / f"checkbeat-{i}.log")
            for i in range(count)
        ]  # fmt: skip

    def send(self, first: int, n: int) -> None:
        now = time.time()
        batch = []
        for i in range(first, first + n):
            batch.append(
                self.messages.message(
                    job_id=job_id(f"b{i % JOBS:05d}", REGION),
                    region=REGION,
                    lane=1 if i % 10 == 0 else 0,
                    lease_token=f"bench-{i}",
                    scheduled_at=now,
                    effective_scheduled_at=now,
                    cost_ewma_ms=20.0,
                )
            )
        self.publisher.publish(batch)

    def close(self) -> None:
        self.publisher.close()


class Plain(System):
    name = "plain"
    queues = (PLAIN_QUEUE,)
    batched = False

    def __init__(self, broker_url: str, tick_s: float) -> None:
        self.broker_url, self.tick_s = broker_url, tick_s
        self.env = base_env(BENCH_BROKER_URL=broker_url)
        self.app: Celery | None = None
        self.connection: Any = None

    def start_workers(self, events: bool, count: int, logs: Path) -> list[Worker]:
        self.close()
        self.app = Celery("bench-broker-producer", broker=self.broker_url)
        self.app.conf.update(
            task_serializer="json",
            broker_connection_retry_on_startup=True,
            task_send_sent_event=events,
        )
        self.connection = self.app.connection_for_write()
        flags = ["-E"] if events else []
        return [
            Worker("bench.plain_app", ["-Q", PLAIN_QUEUE, "-c", str(SLOTS), "-n",
                   f"plain{i}@broker", "-l", "ERROR", *flags], self.env, logs / f"plain-{i}.log")
            for i in range(count)
        ]  # fmt: skip

    def send(self, first: int, n: int) -> None:
        assert self.app is not None
        for i in range(first, first + n):
            self.app.send_task(
                "bench.noop", args=[f"t{i}"], queue=PLAIN_QUEUE, connection=self.connection
            )

    def close(self) -> None:
        if self.connection is not None:
            self.connection.release()
            self.connection = None


def _depth(client: redis.Redis, queues: Sequence[str]) -> int:
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
    return sum(pipe.execute())


def _consumers(client: redis.Redis) -> int:
    """Clients of the broker blocked in (or last sending) BRPOP: the workers' consumers."""
    return sum(1 for c in client.client_list() if c.get("cmd") == "brpop")


def _measure(
    system: System,
    rate: float | str,
    shape: Shape,
    admin: redis.Redis,
    workers: list[Worker],
    idle: float,
) -> dict[str, Any]:
    backlog = BACKLOG_PER_SLOT * SLOTS * shape.workers
    depth = lambda: _depth(admin, system.queues)  # noqa: E731
    feed = Feed(system.send, system.batched, rate, system.tick_s, depth, backlog).start()
    try:
        feed._stop.wait(shape.warmup_s)
        pids = [w.process.pid for w in workers]
        sent0, calls0, depth0 = feed.sent, feed.calls, _depth(admin, system.queues)
        w_cpu0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        own0 = time.process_time()
        meter = ServerMeter(admin)
        feed._stop.wait(shape.window_s)
        commands, net, cpu = meter.delta()
        wall = time.monotonic() - t0
        sent, calls, depth = feed.sent - sent0, feed.calls - calls0, _depth(admin, system.queues)
        worker_cpu = sum(cpu_seconds(p) for p in pids) - w_cpu0
        own_cpu = time.process_time() - own0
    finally:
        feed.stop()
    commands.pop("llen", None)  # the bench's own (the window's edges, max's top-ups)
    cpu = max(1e-9, cpu - idle * wall)
    runs = sent - (depth - depth0)
    per = runs or float("nan")
    figures = {
        "rate": rate,
        "runs": runs,
        "runs_per_s": runs / wall,
        "sent_per_s": sent / wall,
        "messages_per_publish": sent / calls if calls else 0.0,
        "backlog_at_end": depth,
        "commands_per_run": sum(commands.values()) / per,
        "commands": {k: v / per for k, v in commands.most_common()},
        "cpu_us_per_run": cpu / per * 1e6,
        "bytes_per_run": net / per,
        "broker_cpu_cores": cpu / wall,
        "worker_cpu_cores": worker_cpu / wall,
        "publisher_cpu_cores": own_cpu / wall,  # this process: the publisher thread, mostly
        "runs_per_broker_core_s": runs / cpu,
    }
    if rate == MAX:
        figures["limit"] = (
            "broker" if cpu / wall >= SATURATED else "workers" if depth > 0 else "publisher"
        )
    return figures


def _run_system(
    system: System, events: bool, shape: Shape, admin: redis.Redis, logs: Path, idle: float
) -> dict[str, Any]:
    admin.flushdb()
    workers = system.start_workers(events, shape.workers, logs)
    try:
        wait_for(
            lambda: _consumers(admin) >= shape.workers, 90, 0.05, what=f"{system.name}'s workers"
        )
        return {
            str(rate): _measure(system, rate, shape, admin, workers, idle) for rate in shape.rates
        }
    finally:
        for worker in workers:
            worker.stop()


RATIO_FIGURES = ("commands_per_run", "cpu_us_per_run", "bytes_per_run")


def _combine(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one event mode as one: each system's median of every figure per rate (of each
    command's calls too; ``limit``: the most frequent), the median of the rounds' ratios (each
    from one round) and their range, and the rounds themselves."""
    out: dict[str, Any] = {"rounds": list(rounds)}
    rates = list(rounds[0]["checkbeat"])
    for system in ("checkbeat", "plain"):
        out[system] = {}
        for rate in rates:
            runs = [r[system][rate] for r in rounds]
            merged = median_figures(runs)
            merged["rate"] = runs[0]["rate"]  # a number or MAX, the same in every round
            if "limit" in runs[0]:
                merged["limit"] = Counter(fig["limit"] for fig in runs).most_common(1)[0][0]
            out[system][rate] = merged
    out["ratio"], out["ratio_range"] = {}, {}
    for rate in rates:
        out["ratio"][rate], out["ratio_range"][rate] = median_ratios(
            [r["ratio"][rate] for r in rounds], RATIO_FIGURES
        )
    return out


def _print(events: bool, shape: Shape, got: dict[str, Any], title: str, out: Any) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p()
    p(
        f"task events {'on' if events else 'off'}{', ' + title if title else ''}: "
        f"{shape.workers} worker(s) x {SLOTS} threads per system, {shape.window_s:g} s measured "
        f"per rate after {shape.warmup_s:g} s"
    )
    p(f"{'per run':<30}{'rate':>8}{'checkbeat':>12}{'plain':>12}{'ratio':>9}")
    rows = [
        ("runs/s delivered", "runs_per_s", ",.0f"),
        ("messages per publish call", "messages_per_publish", ",.1f"),
        ("broker commands", "commands_per_run", ".2f"),
        ("broker CPU, us", "cpu_us_per_run", ",.1f"),
        ("broker bytes in + out", "bytes_per_run", ",.0f"),
        ("runs/s per broker core", "runs_per_broker_core_s", ",.0f"),
        ("broker CPU, cores", "broker_cpu_cores", ".2f"),
        ("workers' CPU, cores", "worker_cpu_cores", ".2f"),
        ("publisher's CPU, cores", "publisher_cpu_cores", ".2f"),
    ]
    for rate in shape.rates:
        key = str(rate)
        ours, theirs, ratios = got["checkbeat"][key], got["plain"][key], got["ratio"][key]
        shown = rate if rate == MAX else f"{float(rate):,.0f}/s"
        ranges = got.get("ratio_range", {}).get(key, {})
        for label, name, fmt in rows:
            cell = ratio_cell(ratios, ranges, name)
            p(f"{label:<30}{shown:>8}{ours[name]:>12{fmt}}{theirs[name]:>12{fmt}}{cell}")
        if rate == MAX:
            p(f"{'limit':<30}{shown:>8}{ours['limit']:>12}{theirs['limit']:>12}")
        for system, fig in (("checkbeat", ours), ("plain", theirs)):
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(fig["commands"].items())[:8])
            p(f"  {system} commands per run: {top}")


def _summary(figures: dict[str, Any], shape: Shape, out: Any) -> dict[str, Any]:
    """What one broker core carries at a 50 % CPU target, and the checks of a 60 s period that
    is, in each event mode: from the CPU per run at the highest fixed rate, and at ``max`` (the
    highest rate the workers took here: a broker's cost per run falls as its rate rises, so the
    fixed rate's figure is the cautious one)."""
    fixed = str(max(float(r) for r in shape.rates if r != MAX))
    summary: dict[str, Any] = {"fixed_rate": float(fixed)}
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p()
    for mode in ("events_on", "events_off"):
        summary[mode] = {}
        for key, name in ((fixed, "fixed"), (MAX, MAX)):
            ours, theirs = figures[mode]["checkbeat"][key], figures[mode]["plain"][key]
            at_50 = 0.5e6 / ours["cpu_us_per_run"]
            s = summary[mode][name] = {
                "runs_per_s": ours["runs_per_s"],
                "cpu_us_per_run": ours["cpu_us_per_run"],
                "runs_per_core_s_at_50": at_50,
                "checks_of_60s_at_50": at_50 * 60,
                "plain_runs_per_core_s_at_50": 0.5e6 / theirs["cpu_us_per_run"],
            }
            p(
                f"one broker core, {mode.replace('_', ' ')}, at {s['runs_per_s']:,.0f} runs/s: "
                f"{s['cpu_us_per_run']:.1f} us per run = {at_50:,.0f} runs/s at a 50 % CPU "
                f"target = {s['checks_of_60s_at_50']:,.0f} checks of a 60 s period (plain "
                f"Celery: {s['plain_runs_per_core_s_at_50']:,.0f} runs/s)"
            )
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (about a minute)")
    parser.add_argument("--window", type=float, help="seconds measured per rate and system")
    parser.add_argument("--warmup", type=float, help="seconds run before each window")
    parser.add_argument("--workers", type=int, help="worker processes per system")
    parser.add_argument("--repeat", type=int, default=1, help="alternated rounds; medians")
    args = parser.parse_args(argv)
    refuse_out_of_range(
        parser,
        seconds=[("--window", args.window), ("--warmup", args.warmup)],
        counts=[("--workers", args.workers), ("--repeat", args.repeat)],
    )
    repeat = args.repeat
    base = QUICK if args.quick else FULL
    shape = Shape(
        base.rates,
        args.warmup or base.warmup_s,
        args.window or base.window_s,
        args.workers or base.workers,
    )
    out = sys.stdout
    figures: dict[str, Any] = {
        "workers": shape.workers,
        "slots": SLOTS,
        "window_s": shape.window_s,
        "repeat": args.repeat,
        "load_average": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="checkbeat-broker-") as tmp:
        logs = Path(tmp)
        state_server = RedisServer(logs / "state").start()
        broker_server = RedisServer(logs / "broker").start()
        checkbeat: Checkbeat | None = None
        try:
            admin = redis.Redis.from_url(broker_server.url(0))
            checkbeat = Checkbeat(state_server.url(0), broker_server.url(0))
            checkbeat.store_jobs()
            plain = Plain(broker_server.url(0), checkbeat.tick_s)
            idle = _idle_cpu_per_s(admin, seconds=2.0)
            figures["idle_cpu_ms_per_s"] = idle * 1e3
            rounds: dict[str, list[dict[str, Any]]] = {"events_on": [], "events_off": []}
            for k in range(repeat):
                for m, events in enumerate((True, False)):
                    # alternated, so a drift of the machine's load favours neither
                    first = (k + m) % 2 == 0
                    order = (checkbeat, plain) if first else (plain, checkbeat)
                    got = {s.name: _run_system(s, events, shape, admin, logs, idle) for s in order}
                    got["ratio"] = {
                        key: {
                            n: ratio(got["checkbeat"][key][n], got["plain"][key][n])
                            for n in RATIO_FIGURES
                        }
                        for key in got["checkbeat"]
                    }
                    rounds["events_on" if events else "events_off"].append(got)
                    if repeat > 1:
                        _print(events, shape, got, f"round {k + 1} of {repeat}", out)
            for mode, events in (("events_on", True), ("events_off", False)):
                figures[mode] = _combine(rounds[mode])
                title = f"medians of {repeat} alternated rounds" if repeat > 1 else ""
                _print(events, shape, figures[mode], title, out)
            plain.close()
        finally:
            if checkbeat is not None:
                checkbeat.close()
            broker_server.stop()
            state_server.stop()
    figures["one_core"] = _summary(figures, shape, out)
    figures["load_average_end"] = os.getloadavg()[0]
    idle_ms = figures["idle_cpu_ms_per_s"]
    loads = (
        f"{figures['load_average']:.1f} at the start, {figures['load_average_end']:.1f} at the end"
    )
    print(
        f"(the idle broker's {idle_ms:.2f} ms of CPU a second is subtracted; load average {loads})",
        file=out,
    )
    return figures


if __name__ == "__main__":
    command_line(main)
