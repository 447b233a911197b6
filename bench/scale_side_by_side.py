"""Side by side on one Redis: what a check run costs the server (state + broker, events on),
checkbeat against a plain Celery task doing the same work. ``bench.scale_bench --side-by-side``.

Reproduce (from the repository root; starts its own redis-server, HTTP target, beat, workers;
about three minutes, ``--quick`` is a smoke run of seconds)::

    .venv/bin/python -m bench.scale_bench --side-by-side
    .venv/bin/python -m bench.scale_bench --side-by-side --quick

One private redis-server carries everything both systems send (broker on db 0, state on db 1),
so its ``INFO`` deltas are the whole cost of a run: the state writes, the publish, the delivery,
the task events. The two systems run one after the other, the server flushed between, at each
rate (``spare``: 150 checks every 5 s = 30 runs/s; ``near``: 750 every 5 s = 150 runs/s):

- **checkbeat**: the checks created in the check store (kind ``http``, the local target), one
  real ``celery -A celery_app beat`` (its dispatcher) and one ``--role shared`` worker with
  task events on (``-E``), as a deployment runs them;
- **plain Celery**: ``bench.get_state`` (``bench/plain_app.py``: the same GET, then three state
  commands of its own on one round trip) sent by a producer in this process at the instants
  checkbeat would run the same checks (its phases), ``task_send_sent_event`` on as checkbeat's
  app has it, one worker of the same pool and size with task events on (``-E``).

Each system runs ``--warmup`` seconds (processes start, every check runs once, lanes are
learned), then the server is measured over a ``--window`` of steady running: ``INFO
commandstats`` calls (commands inside Lua included), network bytes in + out and
``used_cpu_user + used_cpu_sys``, minus what the idle server spends (measured before either
system starts). A run is a GET the HTTP target answered in the window (each system has its own
path, counted by the server): that is the divisor, and neither system's protocol is assumed.
The runs each system recorded with a finish in the window (checkbeat's results history, plain
Celery's run list) are printed beside it as a check. The ratio is checkbeat / plain Celery.

Which of those commands went to the state and which to the broker, ``INFO`` cannot say (one
server); a ``MONITOR`` sample of ``monitor_s`` seconds after the window counts them per db, per
run answered meanwhile. MONITOR costs the server CPU of its own, so it never overlaps the CPU
window. ``--two-servers`` puts each system's broker on a redis-server of its own instead: each
server's ``INFO`` then counts its commands and its CPU apart, with no sample, and the report
sets what checkbeat's broker alone costs a run against plain Celery's whole run.
"""

from __future__ import annotations

import argparse
import heapq
import json
import re
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench import plain_app
from bench.figures import refuse_out_of_range
from bench.overload_bench import Worker, base_env
from bench.precision_bench import Beat, Load, cpu_seconds
from bench.rounds import median_figures, median_ratios, ratio_cell
from bench.scale_bench import ServerMeter, _idle_cpu_per_s
from celery_app.local.embedded_redis import RedisServer
from scheduling_core.on_tick import MAX_LEAD_S
from tests.support.alternated_rounds import ratio
from tests.support.background import Background
from tests.support.http_target import DelayServer
from tests.support.polling import wait_for

REGION = "local"
#: Each system's own path on the HTTP target (both answer at once): the target counts the GETs
#: of each, which are the runs.
PATHS = {"checkbeat": "/named/checkbeat", "plain": "/named/plain"}
PLAIN_QUEUE = "plain.checks"
#: Both systems' broker and state databases on the one server (``RedisServer.url(db)``).
BROKER_DB, STATE_DB = 0, 1
#: Worker threads of each system, as the precision bench gives them.
SLOTS = 8


@dataclass(frozen=True)
class Servers:
    """Where both systems send their broker and their state: one redis-server (the default),
    or two (``--two-servers``), whose CPU is then measured apart. Why two: on one server the
    broker's share of the CPU can only be estimated from a MONITOR sample of commands; on its
    own server it is measured, so what the broker alone costs a checkbeat run is set against
    plain Celery's whole run."""

    broker: RedisServer
    state: RedisServer  # the broker's, when one server carries both
    #: CPU each of ``distinct`` spends idle a second (its serverCron), subtracted from windows.
    idle: tuple[float, ...] = ()

    @property
    def distinct(self) -> list[RedisServer]:
        return [self.broker] if self.state is self.broker else [self.broker, self.state]

    @property
    def two(self) -> bool:
        return len(self.distinct) == 2

    @property
    def broker_url(self) -> str:
        return self.broker.url(BROKER_DB)

    @property
    def state_url(self) -> str:
        return self.state.url(STATE_DB)

    def admins(self) -> list[redis.Redis]:
        """A client of each of ``distinct``."""
        return [redis.Redis.from_url(s.url(0)) for s in self.distinct]

    def flush(self) -> None:
        for admin in self.admins():
            admin.flushall()


@dataclass(frozen=True)
class Rate:
    """One rate of the comparison: ``load`` (checks, period) and the measured window."""

    load: Load
    warmup_s: float
    window_s: float
    #: After the window, seconds of ``MONITOR``: which commands went to the state, which to the
    #: broker (``INFO commandstats`` does not say; MONITOR does, at a CPU cost of its own).
    monitor_s: float
    #: checkbeat's ``CHECKBEAT_DISPATCH_LEAD`` (None: its default): how far ahead beat claims,
    #: hence how often it ticks under spare capacity (at most every half lead).
    lead_s: float | None = None

    @property
    def name(self) -> str:
        return self.load.name


SPARE = Rate(Load("spare", checks=150, period_s=5, duration_s=0), 12.0, 25.0, 5.0)
NEAR = Rate(Load("near", checks=750, period_s=5, duration_s=0), 12.0, 25.0, 5.0)
QUICK = Rate(Load("quick", checks=20, period_s=2, duration_s=0), 4.0, 4.0, 2.0)


@dataclass
class Window:
    """What the server did over one system's measured window."""

    system: str
    runs: int  # GETs the target answered in the window
    recorded: int  # runs the system recorded as finished in the window
    window_s: float
    commands: Counter
    net_bytes: int
    #: Read events the server handled on client connections (INFO ``total_reads_processed``):
    #: about one per round trip, since a pipelined batch arrives in one read.
    reads: int
    cpu_s: float  # idle subtracted
    worker_cpu_s: float
    by_db: Counter  # commands per db in the MONITOR sample after the window
    monitored_runs: int  # GETs the target answered during that sample
    #: Two servers only: each one's CPU (idle subtracted); ``cpu_s`` is their sum.
    broker_cpu_s: float | None = None
    state_cpu_s: float | None = None

    def figures(self) -> dict[str, Any]:
        runs = self.runs or float("nan")
        sampled = self.monitored_runs or float("nan")
        return {
            "runs": self.runs,
            "recorded_runs": self.recorded,
            "runs_per_s": self.runs / self.window_s,
            "commands_per_run": sum(self.commands.values()) / runs,
            "cpu_us_per_run": self.cpu_s / runs * 1e6,
            "bytes_per_run": self.net_bytes / runs,
            "reads_per_run": self.reads / runs,
            "cpu_us_per_read": self.cpu_s / (self.reads or float("nan")) * 1e6,
            "worker_cpu_ms_per_run": self.worker_cpu_s / runs * 1e3,
            "redis_cpu_ms_per_s": self.cpu_s / self.window_s * 1e3,
            "state_commands_per_run": self.by_db[STATE_DB] / sampled,
            "broker_commands_per_run": self.by_db[BROKER_DB] / sampled,
            "monitored_runs": self.monitored_runs,
            "commands": {k: v / runs for k, v in self.commands.most_common()},
        } | (
            {}
            if self.broker_cpu_s is None or self.state_cpu_s is None
            else {
                "broker_cpu_us_per_run": self.broker_cpu_s / runs * 1e6,
                "state_cpu_us_per_run": self.state_cpu_s / runs * 1e6,
            }
        )


def _seconds(value: Any) -> float | None:
    """A record's instant (ISO text or Unix seconds) as Unix seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(value).timestamp()


_MONITOR_LINE = re.compile(rb"\+(\d+\.\d+) \[(\d+) ")


def commands_by_db(
    port: int, target: DelayServer, path: str, seconds: float
) -> tuple[Counter, int]:
    """``MONITOR`` of the server for ``seconds``: the commands each db received (those a Lua
    script calls included, as commandstats counts them) and the GETs the target answered on
    ``path`` meanwhile. Read on a socket of its own, in bulk: the lines come faster than a
    client that parses each reply reads them. Every line is stamped with the server's clock,
    which is this machine's: the lines stamped before the end are counted, however late they
    are read."""
    counts: Counter = Counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"MONITOR\r\n")
        buf = b""
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        buf = buf.partition(b"\r\n")[2]  # +OK: every command from now on is sent to us
        m0, hits0 = time.time(), target.hits(path)
        m1, hits1 = m0 + seconds, None
        while True:
            lines = buf.split(b"\r\n")
            buf = lines.pop()
            for line in lines:
                found = _MONITOR_LINE.match(line)
                if found is None:
                    continue
                if float(found[1]) >= m1:
                    return counts, (hits1 if hits1 is not None else target.hits(path)) - hits0
                counts[int(found[2])] += 1
            if hits1 is None and time.time() >= m1:
                hits1 = target.hits(path)
            buf += sock.recv(1 << 20)


def _reads(client: redis.Redis) -> int:
    return int(client.info("stats")["total_reads_processed"])


def _measure(
    servers: Servers,
    target: DelayServer,
    path: str,
    worker_pid: int,
    rate: Rate,
    start_at: float,
) -> tuple[float, float, Window]:
    """Deltas of the servers, the target's GETs on ``path`` and the worker's CPU from
    ``start_at`` (this machine's clock) for ``rate.window_s``; returns the window's bounds too.
    Which commands went to the state and which to the broker: on one server, a ``MONITOR``
    sample of ``rate.monitor_s`` after the window; on two, each server's own count."""
    time.sleep(max(0.0, start_at - time.time()))
    admins = servers.admins()
    w0 = time.time()
    reads0 = [_reads(a) for a in admins]
    meters = [ServerMeter(a) for a in admins]
    hits0, cpu0 = target.hits(path), cpu_seconds(worker_pid)
    time.sleep(rate.window_s)
    deltas = [m.delta() for m in meters]
    reads = sum(_reads(a) - r0 - 5 for a, r0 in zip(admins, reads0, strict=True))  # our 5 INFOs
    hits, worker_cpu = target.hits(path) - hits0, cpu_seconds(worker_pid) - cpu0
    w1 = time.time()
    span = w1 - w0
    cpus = [
        max(1e-9, cpu - idle * span) for (_, _, cpu), idle in zip(deltas, servers.idle, strict=True)
    ]
    calls = sum((c for c, _, _ in deltas), Counter())
    if servers.two:
        (broker_calls, _, _), (state_calls, _, _) = deltas
        by_db = Counter({BROKER_DB: broker_calls.total(), STATE_DB: state_calls.total()})
        monitored, split = hits, {"broker_cpu_s": cpus[0], "state_cpu_s": cpus[1]}
    else:
        by_db, monitored = commands_by_db(servers.broker.port, target, path, rate.monitor_s)
        split = {}
    window = Window(
        system="",
        runs=hits,
        recorded=0,
        window_s=span,
        commands=calls,
        net_bytes=sum(net for _, net, _ in deltas),
        reads=reads,
        cpu_s=sum(cpus),
        worker_cpu_s=worker_cpu,
        by_db=by_db,
        monitored_runs=monitored,
        **split,
    )
    return w0, w1, window


# --- checkbeat ----------------------------------------------------------------------------------


def run_checkbeat(
    rate: Rate, slots: int, target: DelayServer, servers: Servers, logs: Path
) -> Window:
    from celery_app.checks.definition import validate_definition
    from celery_app.checks.store import CheckStore
    from celery_app.factory import create_app
    from celery_app.redis.keyspace import state_keys
    from celery_app.redis.schema import ResultField
    from celery_app.settings import load_settings

    load = rate.load
    broker_url, state_url = servers.broker_url, servers.state_url
    servers.flush()
    knobs = {
        "CHECKBEAT_REDIS_URL": state_url,
        "CHECKBEAT_BROKER_URL": broker_url,
        "CHECKBEAT_KEY_PREFIX": "side",
        "CHECKBEAT_REGIONS": REGION,
        "CHECKBEAT_POOL_SIZE": str(slots),
        "CHECKBEAT_FAST_LANE_RESERVED": "0",
        "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",
        "CHECKBEAT_RESULTS_HISTORY": "1000",
    } | ({} if rate.lead_s is None else {"CHECKBEAT_DISPATCH_LEAD": repr(rate.lead_s)})
    settings = load_settings(
        redis_url=state_url,
        broker_url=broker_url,
        key_prefix="side",
        regions=[REGION],
        pool_size=slots,
        fast_lane_reserved=0,
        allow_private_targets=True,
        results_history=1000,
    )
    create_app(settings).loader.import_default_modules()  # the built-in kinds
    state = redis.Redis.from_url(state_url, decode_responses=True)
    keys = state_keys(settings)
    env = base_env(**knobs)
    path = PATHS["checkbeat"]
    worker = Worker(
        "celery_app", ["--role", "shared", "-n", "shared@side", "-E"], env,
        logs / f"checkbeat-{load.name}.log",
    )  # fmt: skip
    beat: Beat | None = None
    try:
        worker.wait_ready()
        beat = Beat(env, logs / f"beat-{load.name}.log")
        store = CheckStore(state, keys, settings)
        definitions = [
            validate_definition(
                settings, uid=uid, tenant="bench", kind="http", target=target.url(path),
                period=load.period_s, regions=[REGION],
            )
            for uid in load.uids()
        ]  # fmt: skip
        t0 = time.time()
        batches: dict[float, list] = {}
        for i, definition in enumerate(definitions):
            batches.setdefault(load.created_at(i, t0), []).append(definition)
        for at, batch in sorted(batches.items()):
            store.create_many(batch, now=datetime.fromtimestamp(at, UTC))
        wait_for(
            lambda: target.hits(path) > 0,
            60,
            0.05,
            what="checkbeat's first run (beat and worker up)",
        )
        w0, w1, window = _measure(
            servers, target, path, worker.process.pid, rate, t0 + rate.warmup_s
        )
        beat.stop()
        pipe = state.pipeline(transaction=False)
        for uid in load.uids():
            pipe.xrange(keys.results(uid))
        recorded = sum(
            w0 <= (_seconds(json.loads(fields[ResultField.RECORD])["finished_at"]) or 0) < w1
            for entries in pipe.execute()
            for _id, fields in entries
        )
    finally:
        if beat is not None:
            beat.stop()
        worker.stop()
    return replace(window, system="checkbeat", recorded=recorded)


# --- plain Celery -------------------------------------------------------------------------------


class Producer(Background):
    """Sends ``bench.get_state`` for every check at each of its ticks (checkbeat's phases for
    the same uids created at the same instants) from a thread, until stopped."""

    def __init__(self, load: Load, broker_url: str, url: str, t0: float) -> None:
        super().__init__("side-producer")
        self.load, self.url, self.t0 = load, url, t0
        self.app = Celery("bench-side-producer", broker=broker_url)
        self.app.conf.update(
            task_serializer="json",
            broker_connection_retry_on_startup=True,
            task_send_sent_event=True,  # as checkbeat's app (events on in both)
        )
        self.sent = 0

    def _ticks(self) -> Iterator[tuple[float, str]]:
        """Every check's ticks, in order: its first, then one a period later, and so on."""
        load = self.load
        heap = [
            (load.first_tick(uid, load.created_at(i, self.t0)), uid)
            for i, uid in enumerate(load.uids())
        ]
        heapq.heapify(heap)
        while True:
            at, uid = heap[0]
            yield at, uid
            heapq.heapreplace(heap, (at + load.period_s, uid))

    def _run(self) -> None:
        with self.app.connection_for_write() as conn:
            for i, (at, uid) in enumerate(self._ticks()):
                if self._stop.wait(max(0.0, at - time.time())):
                    return
                self.app.send_task(
                    "bench.get_state",
                    args=[f"t{i}", uid, self.url, at, self.load.period_s],
                    queue=PLAIN_QUEUE,
                    connection=conn,
                )
                self.sent += 1


def run_plain(rate: Rate, slots: int, target: DelayServer, servers: Servers, logs: Path) -> Window:
    load = rate.load
    broker_url, state_url = servers.broker_url, servers.state_url
    servers.flush()
    state = redis.Redis.from_url(state_url)
    env = base_env(BENCH_BROKER_URL=broker_url, BENCH_STATE_URL=state_url)
    path = PATHS["plain"]
    worker = Worker(
        "bench.plain_app", ["-Q", PLAIN_QUEUE, "-c", str(slots), "-n", "plain@side", "-E"], env,
        logs / f"plain-{load.name}.log",
    )  # fmt: skip
    producer: Producer | None = None
    try:
        worker.wait_ready()
        t0 = time.time()
        producer = Producer(load, broker_url, target.url(path), t0).start()
        wait_for(lambda: target.hits(path) > 0, 60, 0.05, what="plain Celery's first run")
        w0, w1, window = _measure(
            servers, target, path, worker.process.pid, rate, t0 + rate.warmup_s
        )
        producer.stop()
        recorded = sum(
            w0 <= json.loads(r)["finished_at"] < w1 for r in state.lrange(plain_app.RUNS_KEY, 0, -1)
        )
    finally:
        if producer is not None:
            producer.stop()
        worker.stop()
    return replace(window, system=plain_app.PLAIN_NAME, recorded=recorded)


# --- report -------------------------------------------------------------------------------------


RATIO_FIGURES = (
    "commands_per_run",
    "state_commands_per_run",
    "broker_commands_per_run",
    "cpu_us_per_run",
    "bytes_per_run",
    "reads_per_run",
    "cpu_us_per_read",
    "worker_cpu_ms_per_run",
)


#: Two servers only: each server's CPU per run, and what checkbeat's broker alone costs a run
#: against all a plain Celery run costs (the share of plain Celery's CPU left for the state).
SPLIT_RATIO_FIGURES = ("broker_cpu_us_per_run", "state_cpu_us_per_run")
BROKER_VS_PLAIN_TOTAL = "broker_cpu_vs_plain_total"


def compare(checkbeat: dict[str, Any], plain: dict[str, Any]) -> dict[str, float]:
    """checkbeat / plain Celery of every per-run figure, from the same run."""
    out = {name: ratio(checkbeat[name], plain[name]) for name in RATIO_FIGURES}
    if "broker_cpu_us_per_run" in checkbeat:
        out |= {name: ratio(checkbeat[name], plain[name]) for name in SPLIT_RATIO_FIGURES}
        out[BROKER_VS_PLAIN_TOTAL] = ratio(
            checkbeat["broker_cpu_us_per_run"], plain["cpu_us_per_run"]
        )
    return out


def print_rate(rate: Rate, title: str, figures: dict[str, Any], out: Any) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    load = rate.load
    ours, theirs, ratios = figures["checkbeat"], figures["plain"], figures["ratio"]
    spans = figures.get("ratio_range", {})
    two = "broker_cpu_us_per_run" in ours
    where = "two redis-servers (broker, state)" if two else "one redis-server (broker + state)"
    sample = "its server" if two else "MONITOR sample"
    p()
    p(
        f"{load.name}{', ' + title if title else ''}: {load.checks} checks every "
        f"{load.period_s} s = {load.rate:g} runs/s, {figures.get('slots', SLOTS)} slots, "
        f"measured over {rate.window_s:g} s after {rate.warmup_s:g} s; {where}, "
        "task events on in both"
        + ("" if rate.lead_s is None else f"; checkbeat's dispatch lead {rate.lead_s:g} s")
    )
    p(f"{'per run':<34}{'checkbeat':>12}{plain_app.PLAIN_NAME:>15}{'ratio':>9}")
    rows = [
        ("runs in the window (target GETs)", "runs", ",.0f"),
        ("runs recorded in the window", "recorded_runs", ",.0f"),
        ("runs/s", "runs_per_s", ".1f"),
        ("Redis commands", "commands_per_run", ".1f"),
        (f"  state (db 1), {sample}", "state_commands_per_run", ".1f"),
        (f"  broker (db 0), {sample}", "broker_commands_per_run", ".1f"),
        ("Redis CPU, us", "cpu_us_per_run", ",.0f"),
    ]
    if two:
        rows += [
            ("  state server's CPU, us", "state_cpu_us_per_run", ",.0f"),
            ("  broker server's CPU, us", "broker_cpu_us_per_run", ",.0f"),
        ]
    rows += [
        ("Redis bytes in + out", "bytes_per_run", ",.0f"),
        ("Redis requests read (~round trips)", "reads_per_run", ".1f"),
        ("  Redis CPU per request read, us", "cpu_us_per_read", ".1f"),
        ("worker CPU, ms", "worker_cpu_ms_per_run", ".2f"),
    ]
    for label, name, fmt in rows:
        cell = ratio_cell(ratios, spans, name)
        p(f"{label:<34}{ours[name]:>12{fmt}}{theirs[name]:>15{fmt}}{cell}")
    if two:
        cell = ratio_cell(ratios, spans, BROKER_VS_PLAIN_TOTAL).strip()
        p(f"checkbeat's broker alone against plain Celery's whole run: {cell}")
    for system, fig in (("checkbeat", ours), (plain_app.PLAIN_NAME, theirs)):
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(fig["commands"].items())[:10])
        p(f"  {system} commands per run: {top}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The side-by-side mode's own options (``bench.scale_bench`` parses them)."""
    group = parser.add_argument_group("--side-by-side")
    group.add_argument("--only", choices=[SPARE.name, NEAR.name], action="append",
                       help="one rate only (repeatable; default both)")  # fmt: skip
    group.add_argument("--window", type=float, help="seconds measured per system and rate")
    group.add_argument("--warmup", type=float, help="seconds run before the window")
    group.add_argument("--slots", type=int, help=f"worker threads (both systems; {SLOTS})")
    group.add_argument("--repeat", type=int, help="alternated rounds per rate; medians printed")
    group.add_argument("--dispatch-lead", type=float, metavar="SECONDS",
                       help="checkbeat's CHECKBEAT_DISPATCH_LEAD (default: its own, 0.1): "
                       "beat ticks at most every half lead")  # fmt: skip
    group.add_argument("--two-servers", action="store_true",
                       help="the broker on a redis-server of its own, each server's CPU "
                       "measured apart (default: one server for both)")  # fmt: skip


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the mode's options out of range, or given without ``--side-by-side``."""
    given = [
        name
        for name, value in (("--only", args.only), ("--window", args.window),
                            ("--warmup", args.warmup), ("--slots", args.slots),
                            ("--repeat", args.repeat),
                            ("--two-servers", args.two_servers or None),
                            ("--dispatch-lead", args.dispatch_lead))
        if value is not None
    ]  # fmt: skip
    if given and not args.side_by_side:
        parser.error(f"{given[0]} is an option of --side-by-side")
    refuse_out_of_range(
        parser,
        seconds=[("--window", args.window), ("--warmup", args.warmup)],
        counts=[("--slots", args.slots), ("--repeat", args.repeat)],
    )
    lead = args.dispatch_lead
    if lead is not None and not 0 <= lead <= MAX_LEAD_S:
        parser.error(f"--dispatch-lead takes seconds from 0 up to {MAX_LEAD_S:g}, not {lead:g}")


def combine(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one rate as one: each system's median of every figure (of each command's
    calls too), the median of the rounds' ratios (each from one round: both systems of a round
    saw the same machine) and their range, and the rounds themselves."""
    out: dict[str, Any] = {"rounds": list(rounds)}
    for system in ("checkbeat", "plain"):
        out[system] = median_figures([r[system] for r in rounds])
    out["ratio"], out["ratio_range"] = median_ratios(
        [r["ratio"] for r in rounds], rounds[0]["ratio"].keys()
    )
    return out


def run(
    quick: bool,
    only: Sequence[str] | None = None,
    window_s: float | None = None,
    warmup_s: float | None = None,
    slots: int | None = None,
    repeat: int = 1,
    out: Any = sys.stdout,
    two_servers: bool = False,
    lead_s: float | None = None,
) -> dict[str, Any]:
    slots = slots or SLOTS
    rates = [QUICK] if quick else [r for r in (SPARE, NEAR) if not only or r.name in only]
    rates = [
        replace(r, window_s=window_s or r.window_s, warmup_s=warmup_s or r.warmup_s, lead_s=lead_s)
        for r in rates
    ]
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="checkbeat-side-") as tmp:
        logs = Path(tmp)
        broker = RedisServer(logs / "redis").start()
        state = RedisServer(logs / "redis-state").start() if two_servers else broker
        try:
            with DelayServer() as target:
                servers = Servers(broker, state)
                idle = tuple(_idle_cpu_per_s(a, seconds=2.0) for a in servers.admins())
                servers = replace(servers, idle=idle)
                figures["idle_cpu_ms_per_s"] = sum(idle) * 1e3
                figures["two_servers"] = two_servers
                for rate in rates:
                    args = (rate, slots, target, servers, logs)
                    shape = {
                        "load": asdict(rate.load) | {"rate": rate.load.rate},
                        "warmup_s": rate.warmup_s,
                        "window_s": rate.window_s,
                        "slots": slots,
                        "dispatch_lead_s": lead_s,
                    }
                    rounds = []
                    for k in range(repeat):
                        # alternated, so a drift of the machine's load favours neither
                        order = ("checkbeat", "plain") if k % 2 == 0 else ("plain", "checkbeat")
                        got = {
                            name: (run_checkbeat if name == "checkbeat" else run_plain)(*args)
                            for name in order
                        }
                        ours, theirs = got["checkbeat"].figures(), got["plain"].figures()
                        rounds.append(
                            {"checkbeat": ours, "plain": theirs, "ratio": compare(ours, theirs)}
                        )
                        if repeat > 1:
                            print_rate(rate, f"round {k + 1} of {repeat}", rounds[-1] | shape, out)
                    figures[rate.name] = shape | combine(rounds)
                    title = f"medians of {repeat} alternated rounds" if repeat > 1 else ""
                    print_rate(rate, title, figures[rate.name] | shape, out)
        finally:
            broker.stop()
            if state is not broker:
                state.stop()
    idle_ms, whose = figures["idle_cpu_ms_per_s"], "servers'" if two_servers else "server's"
    print(f"\n(the idle {whose} {idle_ms:.2f} ms of CPU a second is subtracted)", file=out)
    return figures
