"""Real checkbeat processes for the fault tests: beat and workers as ``celery`` subprocesses.

Each runs in its own session (process group), so a test can SIGKILL one process, or a whole
worker with its pool children, by id, as a crash or an OOM kill would. ``ahead_clock`` and
``clocked_env`` are the set-up every test of cron windows shares: its processes on the test
clock (``CHECKBEAT_TEST_CLOCK``), importing a cron tasks module the test writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from celery_app.cron_tasks.registration import window_start
from celery_app.wall_clock import TEST_CLOCK_ENV, Clock

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
_TICKS = os.sysconf("SC_CLK_TCK")


def process_env(extra_paths: tuple[Path, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment (the test Redis URLs, key prefix) plus ``extra``, with the
    repo, tests/ and ``extra_paths`` importable."""
    env = dict(os.environ)
    paths = [str(ROOT), str(TESTS), *map(str, extra_paths)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def ahead_clock(rate: float, into_window_s: float = 50.0) -> Clock:
    """The test clock at ``rate`` simulated seconds a real one, from ``into_window_s`` into the
    minute window an hour from now: an hour ahead, so a message's expiry (its window's end plus
    the grace) stays in the real future; near the window's end, so the first window closes
    after a few real seconds."""
    start = window_start(datetime.now(UTC)) + timedelta(hours=1, seconds=into_window_s)
    return Clock(start, time.time(), rate)


def clocked_env(
    tmp_path: Path,
    clock: Clock,
    tasks: str,
    source: str,
    *,
    imports: tuple[str, ...] = (),
    extra_paths: tuple[Path, ...] = (),
    **extra: str,
) -> dict[str, str]:
    """The environment of beats and workers on ``clock`` (``process_env``) that import the cron
    tasks ``source``, written to ``tmp_path`` as the module ``tasks``, then ``imports`` (modules
    on ``extra_paths``)."""
    (tmp_path / f"{tasks}.py").write_text(textwrap.dedent(source))
    return process_env(
        (tmp_path, *extra_paths),
        CHECKBEAT_IMPORTS=",".join((tasks, *imports)),
        **{TEST_CLOCK_ENV: clock.encode()},
        **extra,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (e.g. a prefork pool's processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(p) for p in text)
    return found


class CeleryProcess:
    """``celery -A celery_app <args>`` with its output in ``log``."""

    def __init__(self, args: list[str], log: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.args = args
        self.log = log
        self._out = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", *args],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def kill(self, *, group: bool = False) -> None:
        """SIGKILL the process (``group``: with every process it started)."""
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        elif self.alive():
            self.process.kill()
        self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Warm shutdown (SIGTERM); SIGKILL the group if it does not finish in time."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(group=True)
        # Pool children of a killed main process must not outlive the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._out.close()
        return self.process.returncode


class Processes:
    """Starts beats and workers for one test; stops every one at the end."""

    def __init__(self, tmp: Path, env: Mapping[str, str]) -> None:
        self.tmp = tmp
        self.env = dict(env)
        self.started: list[CeleryProcess] = []

    def _start(self, kind: str, args: list[str], **env: str) -> CeleryProcess:
        log = self.tmp / f"{kind}-{len(self.started)}.log"
        proc = CeleryProcess(args, log, {**self.env, **env}, self.tmp)
        self.started.append(proc)
        return proc

    def beat(self, **env: str) -> CeleryProcess:
        return self._start("beat", ["beat", "--loglevel", "INFO"], **env)

    def worker(self, *args: str, **env: str) -> CeleryProcess:
        return self._start(
            "worker",
            ["worker", "--without-mingle", "--without-gossip", "-l", "INFO", *args],
            **env,
        )

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


def elapsed(since: float) -> float:
    return time.monotonic() - since


class LogLines(logging.Handler):
    """Collects one logger's lines (the worker reconfigures the root logger under caplog)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        logging.getLogger(name).addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)
