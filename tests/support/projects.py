"""A user's own Celery project in a tmp dir, driven the way its owner would: ``celery -A proj``.

The project directory is the cwd and on PYTHONPATH; no ``CHECKBEAT_*`` variable of the suite
reaches it unless a test passes one, so what the project's own configuration says is what is
tested. ``PROJ_BROKER_URL`` and ``PROJ_KEY_PREFIX`` tell the project's app where its Redis is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class UserProject:
    """Run ``celery -A <app>`` in ``root``: to completion, or as a logged background process."""

    #: The interpreter that runs ``celery``: the suite's, where checkbeat is the source tree.
    python: str = sys.executable

    def __init__(self, root: Path, broker_url: str, prefix: str, app: str = "proj") -> None:
        self.root, self.broker_url, self.prefix, self.app = root, broker_url, prefix, app
        self.processes: list[subprocess.Popen] = []

    def pythonpath(self) -> list[str]:
        return [str(self.root)]

    def base_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.upper().startswith("CHECKBEAT_")}

    def env(self, **extra: str) -> dict[str, str]:
        environ = self.base_env()
        environ.update(
            PYTHONPATH=os.pathsep.join(self.pythonpath()),
            PROJ_BROKER_URL=self.broker_url,
            PROJ_KEY_PREFIX=self.prefix,
            **extra,
        )
        return environ

    def celery(self, *args: str, app: str | None = None, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.python, "-m", "celery", "-A", app or self.app, *args],
            cwd=self.root,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=90,
        )

    def start(self, *args: str, app: str | None = None, **env: str) -> subprocess.Popen:
        """Start ``celery <args>`` in the background, its output in ``<command>-<n>.log``."""
        log = open(self.root / f"{args[0]}-{len(list(self.root.glob('*.log')))}.log", "w")  # noqa: SIM115
        process = subprocess.Popen(
            [self.python, "-m", "celery", "-A", app or self.app, *args],
            cwd=self.root,
            env=self.env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def logs(self, tail: int | None = None) -> str:
        return "\n".join(p.read_text()[-(tail or 0) :] for p in sorted(self.root.glob("*.log")))

    def stop_all(self) -> None:
        for process in self.processes:
            stop(process)


class InstalledProject(UserProject):
    """The project run by the interpreter of a virtualenv checkbeat was installed into, with
    the environment ``base`` (no ``PYTHONPATH`` but the project's: the tree is not importable)."""

    def __init__(
        self, root: Path, broker_url: str, prefix: str, python: Path, base: dict[str, str]
    ) -> None:
        super().__init__(root, broker_url, prefix)
        self.python, self._base = str(python), base

    def base_env(self) -> dict[str, str]:
        return dict(self._base)


def stop(process: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM (Celery's warm shutdown, a redis-server's save-less exit), then SIGKILL if it has
    not ended within ``timeout`` s. A process that already ended is left alone."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_module(
    module: str, *args: str, cwd: Path, pythonpath: list[Path], timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m <module> <args>`` to completion, with the suite's environment plus ``env`` and
    ``pythonpath`` (checkbeat's own commands, run the way an operator types them)."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), **env}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
