"""Run a few child processes as one unit: start in order, watch, stop in order.

Why not ``celery multi`` or honcho: ``checkbeat up`` must stop beat before the workers (so nothing
new is published while they drain), report a child that dies instead of showing a stale view, and
leave no process behind on Ctrl-C. Each child gets its own session so a terminal's Ctrl-C reaches
only the supervisor, which then decides the order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from celery_app.errors import CheckbeatError


@dataclass(frozen=True)
class ChildSpec:
    """One process to run: its name (for messages), argv and environment."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 20.0


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class ChildDied(CheckbeatError, RuntimeError):
    """A child exited while the supervisor expected it to run."""

    def __init__(self, child: Child) -> None:
        self.child = child
        super().__init__(
            f"{child.name} (pid {child.pid}) exited with status {child.process.returncode}"
            + (f"; its log is {child.log_path}" if child.log_path else "")
        )


@dataclass
class Supervisor:
    """Starts children in the given order and stops them in reverse order of ``stop_order``."""

    log_dir: Path | None = None
    children: list[Child] = field(default_factory=list)
    echo: Callable[[str], None] = print

    def start(self, spec: ChildSpec) -> Child:
        log: IO[bytes] | int | None = None
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{spec.name}.log"
            log = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        process = subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            start_new_session=True,
        )
        if log is not None and not isinstance(log, int):
            log.close()
        child = Child(spec, process, log_path)
        self.children.append(child)
        self.echo(f"started {spec.name} (pid {process.pid})")
        return child

    def check(self) -> None:
        """Raise ChildDied for the first child that is no longer running."""
        for child in self.children:
            if not child.alive():
                raise ChildDied(child)

    def stop(self, stages: Sequence[Sequence[str]] = ()) -> dict[str, int | None]:
        """Stop every child: stage by stage (each stage signalled at once, then awaited), then
        whatever no stage named, last started first. Returns each child's exit status."""
        by_name = {child.name: child for child in self.children}
        ordered = [[by_name[n] for n in stage if n in by_name] for stage in stages]
        named = {child.name for stage in ordered for child in stage}
        ordered += [[c] for c in reversed(self.children) if c.name not in named]
        codes: dict[str, int | None] = {}
        for stage in ordered:
            codes.update(self._stop_together(stage))
        return codes

    def _stop_together(self, children: Sequence[Child]) -> dict[str, int | None]:
        for child in children:
            if child.alive():
                self.echo(f"stopping {child.name} (pid {child.pid})")
                _signal_group(child.pid, child.spec.stop_signal)
        for child in children:
            try:
                child.process.wait(child.spec.stop_timeout)
            except subprocess.TimeoutExpired:
                self.echo(f"{child.name} did not stop in {child.spec.stop_timeout}s; killing it")
                _signal_group(child.pid, signal.SIGKILL)
                child.process.wait(5)
            # Whatever it left in its session (a pool child) goes too.
            _signal_group(child.pid, signal.SIGKILL)
        return {child.name: child.process.returncode for child in children}


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
