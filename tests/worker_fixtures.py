"""Fixtures for the worker tests: celery worker subprocesses and the probe target server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.http_target import DelayServer

REPO = Path(__file__).resolve().parent.parent


def worker_env(**extra: str) -> dict[str, str]:
    """The test environment (Redis URLs, key prefix) plus ``extra``, with the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


class WorkerProcess:
    """One ``celery -A celery_app worker`` subprocess; stop() is a warm shutdown (SIGTERM)."""

    def __init__(self, args: list[str], log: Path, **env: str) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", *args],
            cwd=REPO,
            env=worker_env(**env),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._log_file.close()
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log_file.close()


@pytest.fixture
def start_worker_process(tmp_path: Path) -> Iterator:
    """Factory: start_worker_process(*args, **env) -> WorkerProcess, stopped after the test."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(
            ["--without-mingle", "--without-gossip", "-l", "INFO", *args], log, **env
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def target() -> Iterator[DelayServer]:
    """A real HTTP server on 127.0.0.1 that answers after a chosen delay."""
    with DelayServer() as server:
        yield server
