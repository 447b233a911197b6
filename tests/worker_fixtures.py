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


# --- in-process workers on a per-test app ---------------------------------------------------


@pytest.fixture
def make_app(broker_url: str, redis_url: str) -> Iterator:
    """Factory: make_app(**settings) -> a checkbeat Celery app with those settings.

    The broker db is emptied first so no message of an earlier test is consumed.
    """
    import redis as redis_lib

    from celery_app.factory import create_app
    from celery_app.settings import load_settings

    broker = redis_lib.Redis.from_url(broker_url)
    broker.flushdb()
    broker.close()

    def make(**overrides: object):
        settings = load_settings(
            redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", **overrides
        )
        app = create_app(settings)
        app.loader.import_default_modules()  # the kinds, as the CLI and the workers load them
        return app

    yield make


@pytest.fixture
def run_worker() -> Iterator:
    """Factory: run_worker(app, queues, concurrency) starts an in-process threads-pool worker."""
    from contextlib import ExitStack

    from celery.contrib.testing.worker import start_worker

    import workers.tasks  # noqa: F401 - the run task and its signal handlers

    with ExitStack() as stack:

        def run(app, queues: list[str], concurrency: int = 2, hostname: str | None = None):
            return stack.enter_context(
                start_worker(
                    app,
                    pool="threads",
                    concurrency=concurrency,
                    perform_ping_check=False,
                    shutdown_timeout=30,
                    queues=queues,
                    loglevel="INFO",
                    **({"hostname": hostname} if hostname else {}),
                )
            )

        yield run


@pytest.fixture
def allow_private(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CHECKBEAT_ALLOW_PRIVATE_TARGETS=1 for this process (checks on 127.0.0.1 may be created)."""
    from celery_app.settings import get_settings

    monkeypatch.setenv("CHECKBEAT_ALLOW_PRIVATE_TARGETS", "1")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def claim_by_hand(client, keys, job_id: str, token: str, lease_s: float = 60.0) -> dict:
    """Take a job's lease as the dispatcher's claim does (test data for single-run tests):
    returns the run_check kwargs for it."""
    import time

    from celery_app.checks.jobs import read_job
    from celery_app.redis.schema import JobField, split_job_id

    job = read_job(client, keys, job_id)
    assert job is not None, job_id
    _uid, region = split_job_id(job_id)
    expiry = time.time() + lease_s
    pipe = client.pipeline(transaction=True)
    pipe.hset(
        keys.job(job_id),
        mapping={JobField.LEASE_TOKEN: token, JobField.LEASE_EXPIRY: f"{expiry:.3f}"},
    )
    pipe.zadd(keys.leases(region, job.lane), {job_id: expiry})
    pipe.zrem(keys.due(), job_id)
    pipe.zrem(keys.ready(region, job.lane), job_id)
    pipe.execute()
    return {
        "job_id": job_id,
        "lease_token": token,
        "scheduled_at": job.scheduled_at,
        "effective_scheduled_at": job.effective_scheduled_at,
        "timeout_s": 5.0,
    }


@pytest.fixture
def claim():
    """:func:`claim_by_hand` as a fixture (so test modules need not import this plugin)."""
    return claim_by_hand


class Ticker:
    """Runs ``Dispatcher.tick()`` every ``interval`` seconds in a thread (beat's job), with
    pause/resume so a test can make starts late. Errors surface at stop()."""

    def __init__(self, dispatcher, interval: float = 0.1) -> None:
        import threading

        self.dispatcher = dispatcher
        self.interval = interval
        self.ticks = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._run, name="test-dispatcher", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._running.is_set():
                continue
            try:
                self.dispatcher.tick()
                self.ticks += 1
            except BaseException as exc:  # report at stop
                self.error = exc
                return

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise self.error


@pytest.fixture
def dispatching() -> Iterator:
    """Factory: dispatching(app, interval=0.1) -> a started Ticker, stopped after the test."""
    from celery_app.checks.dispatch import Dispatcher

    tickers: list[Ticker] = []

    def start(app, interval: float = 0.1) -> Ticker:
        ticker = Ticker(Dispatcher(app), interval).start()
        tickers.append(ticker)
        return ticker

    yield start
    for ticker in tickers:
        ticker.stop()
