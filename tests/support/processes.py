"""Celery beat and worker subprocesses with their own environment, stopped in reverse order.

For tests that run a whole system (the metrics tests): each process logs to a file of the
test's directory, so a failure can show what the process said.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from support.workers import REPO, worker_env


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def celery(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_app", *args],
                cwd=self.log_dir,
                env=worker_env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append((name, process, log))
        return process

    def output(self, name: str) -> str:
        return next(log for n, _p, log in self.started if n == name).read_text(errors="replace")

    def stop(self) -> None:
        for _name, process, _log in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _name, process, _log in reversed(self.started):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def http_status(url: str) -> int | None:
    """The status of GET ``url`` (None: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read().decode()


__all__ = ["REPO", "Processes", "http_status", "http_text"]
