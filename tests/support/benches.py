"""Running a bench the way its reader does: ``python -m bench.<name> ... --json`` from the
repository root, in its own process, and reading the figures it returns (``bench/figures.py``).

The smoke tests assert on those numbers, not on the table the bench prints, and never import
``bench/``: a bench is a program of its own, and what it shares with the tests lives here in
``tests/support``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from support.workers import REPO, worker_env


def bench_process(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench.<name> *args`` from the repository root, in the suite's environment,
    run to its end (within ``timeout`` seconds); its stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(name: str, *args: str) -> str:
    """The line ``bench/<name>.py`` refuses ``args`` with, its last on stderr: it must exit 2
    before anything starts, with no traceback and nothing on stdout."""
    done = bench_process(name, *args, timeout=60)
    assert done.returncode == 2, done.stderr[-4000:]
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr[-4000:]
    return done.stderr.strip().splitlines()[-1]


def run_bench(name: str, *args: str, timeout: float) -> Any:
    """The figures ``bench/<name>.py`` returns for ``args`` (it must exit 0 within ``timeout``
    seconds; what it printed is in the failure message)."""
    done = bench_process(name, *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)
