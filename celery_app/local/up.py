"""``checkbeat up``: the whole system on one machine, as separate processes, in one command.

It runs what compose.yaml runs (one beat, per region a fast-lane and a shared worker, Flower when
installed) against ``CHECKBEAT_REDIS_URL`` or an embedded redis-server whose data lives in
``--data-dir`` (AOF on), so a restart keeps the checks. ``--demo`` adds a local target with fast,
slow, flaky and timing-out endpoints, demo checks over two tenants and two regions, and a
per-tenant cron task.

Stop order on Ctrl-C or SIGTERM: beat first (nothing new is published), then the workers (warm
shutdown: runs in progress finish), then Flower, then Redis. A child that dies is reported and
``up`` exits non-zero rather than showing a stale view.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_app.local.demo_target import DemoTarget

from celery_app.local.embedded_redis import RedisServer, free_port
from celery_app.local.supervisor import ChildDied, ChildSpec, Supervisor

METRICS_ENV = "CHECKBEAT_METRICS_ADDR"
#: The pool of the cron-task worker (see worker_specs).
CRON_TASK_POOL = "prefork"


@dataclass
class UpOptions:
    data_dir: Path = Path(".checkbeat")
    demo: bool = False
    view: bool = True
    flower_port: int = 5555
    pool: str = "threads"
    refresh: float = 1.0


@dataclass
class Stack:
    """Everything ``up`` started, so it can be stopped in order."""

    supervisor: Supervisor
    redis: RedisServer | None = None
    demo_target: DemoTarget | None = None
    env: dict[str, str] = field(default_factory=dict)
    regions: tuple[str, ...] = ()
    app: Any = None

    def stop(self) -> dict[str, int | None]:
        names = [c.name for c in self.supervisor.children]
        workers = [n for n in names if n.startswith("worker")]
        codes = self.supervisor.stop([["beat"], workers, ["flower"]])
        if self.demo_target is not None:
            self.demo_target.stop()
        if self.redis is not None:
            self.redis.stop()
        return codes


def child_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment every child gets: the caller's, plus checkbeat's connection settings."""
    env = dict(base)
    env.update(extra)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "celery_app", *args]


def worker_specs(env: Mapping[str, str], regions: tuple[str, ...], pool: str) -> list[ChildSpec]:
    """Per region the two lane workers, and one worker for cron tasks (Celery's default queue),
    with the same commands as compose.yaml.

    The cron-task worker is always prefork: only a pool with child processes enforces the hard
    time limit, so a task that overruns its timeout is killed when its in-flight key expires
    and "skip while the previous run is in flight" stays true. Lane workers use ``pool``.
    """
    specs = [
        ChildSpec(
            name="worker-tasks",
            argv=celery_argv(
                "worker",
                "--queues",
                "celery",
                "--pool",
                CRON_TASK_POOL,
                "--concurrency",
                "4",
                "--loglevel",
                "INFO",
                "--hostname",
                "tasks@%h",
                "--task-events",
            ),
            env=env,
            stop_timeout=30.0,
        )
    ]
    for region in regions:
        for role in ("fast", "shared"):
            specs.append(
                ChildSpec(
                    name=f"worker-{region}-{role}",
                    argv=celery_argv(
                        "worker",
                        "--role",
                        role,
                        "--region",
                        region,
                        "--pool",
                        pool,
                        "--loglevel",
                        "INFO",
                        "--hostname",
                        f"{role}-{region}@%h",
                        "--task-events",
                    ),
                    env=env,
                    stop_timeout=30.0,
                )
            )
    return specs


def with_metrics(spec: ChildSpec) -> ChildSpec:
    """``spec`` serving /metrics and /healthz on a free loopback port of its own."""
    addr = f"127.0.0.1:{free_port()}"
    return replace(spec, env={**spec.env, METRICS_ENV: addr})


def metrics_lines(children: list[Any]) -> list[str]:
    """Where each child serves its metrics (what ``up`` prints)."""
    lines = []
    for child in children:
        addr = child.spec.env.get(METRICS_ENV)
        if not addr:
            continue
        extra = f", per check: http://{addr}/metrics/checks" if child.name == "beat" else ""
        lines.append(f"metrics: {child.name} http://{addr}/metrics (health: /healthz{extra})")
    return lines


def flower_available() -> bool:
    return importlib.util.find_spec("flower") is not None


def run_up(
    options: UpOptions,
    echo: Callable[[str], None] = print,
    stop_event: threading.Event | None = None,
) -> int:
    """Start everything, show the view or logs, stop in order; return the exit status."""
    from celery_app.local import bootstrap  # imports celery_app only once env is set

    stop_event = stop_event or threading.Event()
    options.data_dir.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(log_dir=options.data_dir / "logs", echo=echo)
    stack = Stack(supervisor)

    def on_signal(signum: int, _frame: object) -> None:
        stop_event.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        extra = bootstrap.prepare_environment(options, stack, echo)
        env = child_env(os.environ, extra)
        stack.env = env
        bootstrap.before_start(options, stack, echo)
        supervisor.start(with_metrics(ChildSpec("beat", celery_argv("beat", "-l", "INFO"), env)))
        for spec in worker_specs(env, stack.regions, options.pool):
            supervisor.start(with_metrics(spec))
        for line in metrics_lines(supervisor.children):
            echo(line)
        if flower_available():
            port = options.flower_port or free_port()
            supervisor.start(
                ChildSpec(
                    "flower",
                    celery_argv("flower", f"--port={port}", "--address=127.0.0.1"),
                    env,
                    stop_signal=signal.SIGINT,
                    stop_timeout=5.0,
                )
            )
            echo(f"Flower: http://127.0.0.1:{port}/")
        echo(f"logs: {supervisor.log_dir}")
        status = bootstrap.watch(options, stack, stop_event, echo)
    except ChildDied as died:
        echo(f"error: {died}")
        status = 1
    except KeyboardInterrupt:
        status = 0
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
