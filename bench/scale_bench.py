"""Scale bench: Redis commands, bytes and Redis CPU per check run and per cron firing, and what
one Redis core sustains for the check path (docs/scale.md takes its figures from here).

Reproduce (from the repository root, about a minute; --quick is a smoke run)::

    .venv/bin/python -m bench.scale_bench
    .venv/bin/python -m bench.scale_bench --quick
    .venv/bin/python -m bench.scale_bench --rounds 7     # the CPU figure: median of 7 rounds
    .venv/bin/python -m bench.scale_bench --side-by-side  # with plain Celery: see below
    .venv/bin/python -m bench.scale_bench --cluster       # 3 masters, 12 partitions: below

``--cluster`` measures the check half in 12 partitions on a local three-master Redis Cluster,
per master and in one tick over a million checks (``bench/cluster_bench.py``).

``--side-by-side`` measures something else, in a run of its own (``bench/scale_side_by_side.py``):
real beat and workers of checkbeat and of plain Celery, one after the other on one redis-server
that carries both state and broker, task events on, and what a run costs that server in each.

What it does, on two private redis-servers (checkbeat's state on one, the broker on the other,
so each is measured alone), in this process and with checkbeat's own functions:

* check path, per run: every check's second run (its first, which measures its lane and counts
  its state for the first time, is not counted), all due at once, through beat's tick (promote,
  claim, publish) and then, for each message, the worker's path with the functions
  ``workers.tasks.run_check`` and its post-exec handler call: the start read
  (``start_read.read_start``), then ``post_exec.record_outcome`` (the completion, ``complete.lua``,
  with its hand-off of the freed slot, else the refill when work waits). Twice: 3,000 checks
  on 64 slots (a backlog the hand-offs drain) and on 3,000 slots (spare capacity: beat claims
  them all, a completion finds nothing waiting). The worker's capacity is registered by
  ``workers.roles.CapacityRegistration`` in this process, as a threads-pool worker does. Each
  message is taken with kombu's own consumer without acks, as a check worker consumes (a BRPOP
  of the transport's event loop), so the broker figure is a run's publish and its delivery.
* cron path, per firing: ``fire`` (claim Lua with the pending record, publish, confirm), the
  worker's ``run_started`` (run key, ``cron_start.lua``) and ``run_finished``.

Each figure is the delta of ``INFO commandstats`` (calls), ``total_net_input_bytes`` +
``total_net_output_bytes`` and ``used_cpu_user + used_cpu_sys`` of the server, divided by the
number of runs or firings. Runs per Redis core = runs / Redis CPU seconds (the clients here are
one Python process, far slower than the server: the server's own CPU is what a shard spends).
WAIT is off (no replica): under Sentinel each protected write adds one WAIT call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kombu
import redis

from bench.figures import command_line, refuse_out_of_range
from celery_app.checks.definition import validate_definition
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import JobState, ReadGuard, from_unix
from celery_app.checks.kinds import check_kind
from celery_app.checks.run_contract import RunRequest, max_timeout_s
from celery_app.checks.start_read import read_start
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.cron_state import CronStore, FireRequest
from celery_app.cron_tasks.firing import fire
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.pipelined_scripts import ScriptClient
from celery_app.redis.schema import CronOutcome, Keys, check_queue
from celery_app.settings import load_settings
from scheduling_core import Params
from workers.outcome import RunOutcome
from workers.post_exec import record_outcome
from workers.probes.result import ProbeResult
from workers.roles import CapacityRegistration, WorkerRole
from workers.run_start import RunStart

REGION = "local"
WORKER = "bench@scale"
BENCH_KIND = "scalebench"


class ServerMeter:
    """Deltas of one server's commandstats, network bytes and CPU."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = self._read()

    def _read(self) -> tuple[Counter, int, float]:
        stats = self.client.info("commandstats")
        calls = Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})
        info = self.client.info()
        net = int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return calls, net, cpu

    def delta(self) -> tuple[Counter, int, float]:
        calls, net, cpu = self._read()
        c0, n0, u0 = self._start
        diff = Counter({k: calls[k] - c0.get(k, 0) for k in calls})
        diff["info"] -= 2  # the meter's own two INFO calls
        return +diff, net - n0, cpu - u0


def _idle_cpu_per_s(client: redis.Redis, seconds: float = 1.0) -> float:
    """CPU the idle server spends per second (its serverCron): subtracted from the figures,
    since this one Python client keeps the server mostly idle."""
    meter = ServerMeter(client)
    time.sleep(seconds)
    return meter.delta()[2] / seconds


class RunConsumer:
    """The region's run messages, taken as a check worker takes them: kombu's consumer on both
    lanes' queues without acks (``workers.worker_step.consume_without_acks``), each message
    one BRPOP of the transport's event loop."""

    def __init__(self, app: Any, params: Params) -> None:
        self.ceiling_s = max_timeout_s(params)
        self.connection = app.connection_for_read()
        self.received: list[Any] = []
        self.consumer = kombu.Consumer(
            self.connection,
            queues=[kombu.Queue(check_queue(REGION, lane)) for lane in ("fast", "slow")],
            callbacks=[lambda body, message: self.received.append((body, message))],
            no_ack=True,
            accept=["json"],
        )
        self.consumer.consume()

    def next_run(self) -> tuple[RunRequest, str] | None:
        """The next run and the queue it came from; None when none came within 2 s."""
        if not self.received:
            try:
                self.connection.drain_events(timeout=2)
            except TimeoutError:
                return None
        body, message = self.received.pop(0)
        queue = message.delivery_info.get("routing_key", "")
        return RunRequest.parse(body[1], max_timeout_s=self.ceiling_s), queue

    def close(self) -> None:
        self.consumer.cancel()
        self.connection.release()


def _run_all(app: Any, state: Any, keys: Keys, consumer: RunConsumer, runs: int) -> int:
    """Take and run ``runs`` run messages as a worker does (workers.tasks.run_check and its
    post-exec handler): the start read (``read_start``), then ``record_outcome`` (the
    completion, its hand-off or the refill of the freed slot). How many ran."""
    done = 0
    while done < runs:
        delivered = consumer.next_run()
        if delivered is None:
            break
        request, queue = delivered
        task_id = f"bench-{done}"
        read = read_start(
            state,
            keys.of_job(request.job_id),
            request.job_id,
            request.uid,
            request.lease_token,
            task_id,
            60_000,
        )
        start = RunStart(
            task_id,
            JobState.from_hash(request.job_id, read.job_hash),
            ReadGuard.of(read.job_hash, read.maintenance_version),
            read.server_now,
            time.perf_counter(),
        )
        now = time.time()
        outcome = RunOutcome.of_probe(
            request,
            ProbeResult.up(5.0),
            duration_ms=5.0,
            started_at=now,
            finished_at=now,
            worker=WORKER,
            queue=queue,
            secrets=read.secrets(),
        )
        if not record_outcome(app, outcome, start):
            raise RuntimeError(f"the run of {request.job_id} was not recorded")
        done += 1
    return done


def _check_path(checks: int, slots: int, out: Any) -> dict[str, Any]:
    """Every check run twice, the second round measured: all due at once, on ``slots`` slots
    of one worker (fewer slots than checks: a backlog the completions' hand-offs drain; as
    many: beat's tick claims them all and a completion finds nothing waiting)."""
    tmp = Path(tempfile.mkdtemp(prefix="checkbeat-scale-"))
    state_server = RedisServer(tmp / "state").start()
    broker_server = RedisServer(tmp / "broker").start()
    registration: CapacityRegistration | None = None
    try:
        settings = load_settings(
            redis_url=state_server.url(0),
            broker_url=broker_server.url(0),
            key_prefix="cb",
            regions=[REGION],
            redis_wait_replicas=0,
        )
        app = create_app(settings)
        check_kind(BENCH_KIND)(lambda target, config: True)
        # the state client's class is get_redis's: its pipelines send no SCRIPT EXISTS
        state = ScriptClient.from_url(settings.redis_url, decode_responses=True)
        broker = redis.Redis.from_url(settings.effective_broker_url)
        keys = Keys(settings.key_prefix)
        store = CheckStore(state, keys, settings)
        t0 = time.time() - 120
        defs = [
            validate_definition(
                settings,
                uid=f"c{i:06d}",
                tenant=f"t{i % 50}",
                kind=BENCH_KIND,
                target=f"https://e{i}.test/",
                period=60,
                regions=[REGION],
            )
            for i in range(checks)
        ]
        store.create_many(defs, now=from_unix(t0))
        queues = tuple(check_queue(REGION, lane) for lane in ("fast", "slow"))
        registration = CapacityRegistration(
            state, keys, WORKER, WorkerRole("shared", REGION, queues, slots)
        )
        registration.start()
        dispatcher = Dispatcher(app, client=state)
        consumer = RunConsumer(app, Params.from_settings(settings))
        # the first run of every check (its lane measured, its state first counted): not
        # measured; then every job due again at once (set up by hand), and the second round
        dispatcher.tick(time.time())
        if _run_all(app, state, keys, consumer, checks) != checks:
            raise RuntimeError("the first round did not run every check")
        ids = state.zrange(keys.due(), 0, -1)
        state.zadd(keys.due(), dict.fromkeys(ids, time.time() - 1))
        idle_cpu_per_s = _idle_cpu_per_s(state)
        state_meter, broker_meter = ServerMeter(state), ServerMeter(broker)
        started = time.perf_counter()
        dispatcher.tick(time.time())  # beat's tick: promote, claim, publish
        runs = _run_all(app, state, keys, consumer, checks)
        wall_s = time.perf_counter() - started
        s_calls, s_net, s_cpu = state_meter.delta()
        s_cpu = max(1e-9, s_cpu - idle_cpu_per_s * wall_s)  # the server's own idle ticks
        b_calls, b_net, _ = broker_meter.delta()
        consumer.close()
        result = {
            "runs": runs,
            "slots": slots,
            "state_commands_per_run": sum(s_calls.values()) / runs,
            "state_commands": {k: v / runs for k, v in s_calls.most_common()},
            "state_bytes_per_run": s_net / runs,
            "state_cpu_us_per_run": s_cpu / runs * 1e6,
            "runs_per_redis_core_s": runs / s_cpu,
            "idle_cpu_ms_per_s": idle_cpu_per_s * 1000,
            "broker_commands_per_run": sum(b_calls.values()) / runs,
            "broker_bytes_per_run": b_net / runs,
            "client_runs_per_s": runs / wall_s,
        }
        _print_check_path(result, checks, b_calls, out)
        return result
    finally:
        if registration is not None:  # its heartbeat thread, before the server goes
            registration.stop()
        broker_server.stop()
        state_server.stop()


def _print_check_path(result: dict[str, Any], checks: int, b_calls: Counter, out: Any) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    runs, slots = result["runs"], result["slots"]
    how = "a backlog" if slots < checks else "spare capacity"
    p(
        f"check path, {how}: {runs:,} second runs of {checks:,} checks due at once on "
        f"{slots:,} slots (one region, period 60 s)"
    )
    p(
        f"  state Redis per run: {result['state_commands_per_run']:.1f} commands, "
        f"{result['state_bytes_per_run']:,.0f} bytes in+out, "
        f"{result['state_cpu_us_per_run']:.0f} us of Redis CPU"
    )
    top = ", ".join(f"{k} {v:.2f}" for k, v in result["state_commands"].items())
    p(f"    commands per run: {top}")
    p(
        f"  broker per run (publish + kombu's delivery): "
        f"{result['broker_commands_per_run']:.2f} commands, "
        f"{result['broker_bytes_per_run']:,.0f} bytes in+out"
    )
    pub = ", ".join(f"{k} {v / runs:.2f}" for k, v in b_calls.most_common())
    p(f"    commands per run: {pub}")
    per_core = result["runs_per_redis_core_s"]
    p(
        f"  one Redis core: {per_core:,.0f} runs/s of the check path = "
        f"{per_core * 60:,.0f} checks of 60 s period at 100 % "
        f"({per_core * 60 * 0.5:,.0f} at a 50 % CPU target)"
    )
    p(
        f"  (this single Python client drove {result['client_runs_per_s']:,.0f} runs/s; the "
        f"server's idle {result['idle_cpu_ms_per_s']:.1f} ms CPU/s is subtracted)"
    )


def _noop() -> None:
    """The body of the bench's cron tasks (never run here)."""


def _cron_path(tasks: int, windows: int, out: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="checkbeat-scale-cron-"))
    state_server = RedisServer(tmp / "state").start()
    broker_server = RedisServer(tmp / "broker").start()
    try:
        settings = load_settings(
            redis_url=state_server.url(0),
            broker_url=broker_server.url(0),
            key_prefix="cb",
            redis_wait_replicas=0,
        )
        app = create_app(settings)
        for i in range(tasks):
            cron("* * * * *", id=f"b{i}", name=f"scalebench.b{i}", app=app)(_noop)
        all_tasks = list(cron_tasks(app).values())
        # the state client's class is get_redis's: its pipelines send no SCRIPT EXISTS
        state = ScriptClient.from_url(settings.redis_url, decode_responses=True)
        broker = redis.Redis.from_url(settings.effective_broker_url)
        store = CronStore(state, Keys("cb"), settings.cron_grace)
        sender = CronPublisher(app, settings.cron_grace)
        sender.prepare(all_tasks)
        base = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        state_meter, broker_meter = ServerMeter(state), ServerMeter(broker)
        firings = 0
        for w in range(windows):
            window = base + timedelta(minutes=w)
            requests = [FireRequest(task, GLOBAL_TENANT, window) for task in all_tasks]
            done = fire(store, sender, requests, now=window, owner="bench")
            for req in done.fired:
                started = window + timedelta(seconds=1)
                store.run_started(req.task.id, req.tenant, req.window_id, False, started)
                store.run_finished(
                    req.task.id, req.tenant, req.window_id, CronOutcome.SUCCESS, "", started
                )
            firings += len(done.fired)
        s_calls, s_net, s_cpu = state_meter.delta()
        b_calls, b_net, _ = broker_meter.delta()
        assert firings == tasks * windows, firings
        result = {
            "firings": firings,
            "state_commands_per_firing": sum(s_calls.values()) / firings,
            "state_bytes_per_firing": s_net / firings,
            "state_cpu_us_per_firing": s_cpu / firings * 1e6,
            "publish_commands_per_firing": sum(b_calls.values()) / firings,
            "publish_bytes_per_firing": b_net / firings,
        }
        p = lambda *a: print(*a, file=out)  # noqa: E731
        p(f"\ncron path: {firings:,} firings ({tasks} tasks x {windows} windows, one beat)")
        p(
            f"  state Redis per firing: {result['state_commands_per_firing']:.2f} commands, "
            f"{result['state_bytes_per_firing']:,.0f} bytes in+out, "
            f"{result['state_cpu_us_per_firing']:.0f} us of Redis CPU"
        )
        top = ", ".join(f"{k} {v / firings:.3f}" for k, v in s_calls.most_common())
        p(f"    commands per firing: {top}")
        p(
            f"  broker per firing (publish only): {result['publish_commands_per_firing']:.3f} "
            f"commands, {result['publish_bytes_per_firing']:,.0f} B"
        )
        return result
    finally:
        broker_server.stop()
        state_server.stop()


def _check_cluster_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--cluster``'s options out of range, without it, or ``--cluster`` together
    with ``--side-by-side`` (two runs of their own)."""
    if args.cluster and args.side_by_side:
        parser.error("--cluster and --side-by-side are runs of their own: give one")
    for name, value in (("--checks", args.checks), ("--tick-window", args.tick_window)):
        if value is not None and not args.cluster:
            parser.error(f"{name} is an option of --cluster")
    refuse_out_of_range(parser, counts=[("--checks", args.checks)])
    if args.tick_window is not None and not 0 < args.tick_window <= 60:
        parser.error(f"--tick-window takes seconds above 0 up to 60, not {args.tick_window:g}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench import scale_side_by_side  # it builds on this module's meter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (seconds)")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="instead: real beat and workers of checkbeat and of plain Celery on one "
        "redis-server, Redis commands and CPU per run of each at 30 and 150 runs/s "
        "(bench/scale_side_by_side.py)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="instead: a local 3-master Redis Cluster, 12 partitions: commands and CPU per run "
        "on each master, their balance, and one beat tick over 1,000,000 checks "
        "(bench/cluster_bench.py; --quick: 20,000)",
    )
    parser.add_argument(
        "--checks", type=int, default=None, help="--cluster: the checks of the one-tick measure"
    )
    parser.add_argument(
        "--tick-window",
        type=float,
        default=None,
        help="--cluster: seconds of the period the tick finds due (default 10 of 60)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="the check path's two workloads this many times, alternated; the Redis CPU per "
        "run printed as each one's median and range (the commands are the same every round)",
    )
    scale_side_by_side.add_arguments(parser)
    args = parser.parse_args(argv)
    scale_side_by_side.check_arguments(parser, args)
    _check_cluster_arguments(parser, args)
    refuse_out_of_range(parser, counts=[("--rounds", args.rounds)])
    if args.rounds is not None and (args.side_by_side or args.cluster):
        parser.error("--rounds is an option of the check path's bench (see --repeat)")
    if args.cluster:
        from bench import cluster_bench

        window = 10.0 if args.tick_window is None else args.tick_window
        return {"cluster": cluster_bench.run(args.quick, args.checks, window, sys.stdout)}
    if args.side_by_side:
        return {
            "side_by_side": scale_side_by_side.run(
                args.quick,
                args.only,
                args.window,
                args.warmup,
                args.slots,
                args.repeat or 1,
                sys.stdout,
                args.two_servers,
                args.dispatch_lead,
            )
        }
    checks, slots, tasks, windows = (300, 16, 50, 2) if args.quick else (3000, 64, 500, 6)
    rounds: dict[str, list[dict[str, Any]]] = {"checks": [], "checks_spare": []}
    for _ in range(args.rounds or 1):
        rounds["checks"].append(_check_path(checks, slots, sys.stdout))
        rounds["checks_spare"].append(_check_path(checks, checks, sys.stdout))
    figures: dict[str, Any] = {name: results[0] for name, results in rounds.items()}
    if args.rounds:
        figures["cpu_rounds"] = _print_cpu_rounds(rounds, sys.stdout)
    figures["cron"] = _cron_path(tasks, windows, sys.stdout)
    return figures


def _print_cpu_rounds(rounds: dict[str, list[dict[str, Any]]], out: Any) -> dict[str, Any]:
    """Each workload's Redis CPU per run over its rounds: median, range, every round. Why:
    a shared machine moves a round's CPU figure by a third either way within minutes, and
    alternating the workloads spreads that over both."""
    summary: dict[str, Any] = {}
    print(f"\nRedis CPU per run over {len(rounds['checks'])} alternated rounds:", file=out)
    for name, label in (("checks", "a backlog"), ("checks_spare", "spare capacity")):
        cpu = sorted(r["state_cpu_us_per_run"] for r in rounds[name])
        median = statistics.median(cpu)
        summary[name] = {"median": median, "min": cpu[0], "max": cpu[-1], "rounds": cpu}
        print(
            f"  {label}: median {median:.0f} us ({cpu[0]:.0f}-{cpu[-1]:.0f}), "
            f"{rounds[name][0]['state_commands_per_run']:.1f} commands",
            file=out,
        )
    return summary


if __name__ == "__main__":
    command_line(main)
