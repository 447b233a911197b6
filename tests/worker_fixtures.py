"""Fixtures of the worker tests (a plugin listed in tests/conftest.py): celery worker
subprocesses, in-process workers on a per-test app, the probe target servers, the dispatcher.

Their helpers (``WorkerProcess``, ``worker_env``, ``claim_by_hand``, ``Ticker``) are in
:mod:`support.workers`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.http_target import DelayServer
from support.recording_server import RecordingServer
from support.workers import Ticker, WorkerProcess, claim_by_hand


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


@pytest.fixture
def content_server() -> Iterator[RecordingServer]:
    """An HTTP server on 127.0.0.1 serving the routes and pages a test sets, recording every
    request (:class:`RecordingServer`)."""
    with RecordingServer() as server:
        yield server


@pytest.fixture
def other_server() -> Iterator[RecordingServer]:
    """A second :class:`RecordingServer`: on another port, so another origin than
    ``content_server``'s."""
    with RecordingServer() as server:
        yield server


# --- in-process workers on a per-test app ---------------------------------------------------

# celery.contrib.pytest's in-process worker (pytest-celery's plugin re-exports celery.contrib's
# fixtures, then names its own Docker-container worker ``celery_worker``: no containers run here,
# so the in-process one takes the name back). It serves ``celery_app``, below.
from celery.contrib.pytest import celery_worker  # noqa: E402, F401


@pytest.fixture
def celery_app(dispatcher_app):
    """The app ``celery_worker`` serves: checkbeat's own app on the test settings (its tasks,
    signals and post-exec write), not celery.contrib's bare test app."""
    return dispatcher_app


@pytest.fixture
def celery_worker_pool() -> str:
    """Threads: the worker runs in the test's process and sees the tasks it registered."""
    return "threads"


@pytest.fixture
def celery_worker_parameters(settings) -> dict:
    """``celery_worker`` consumes what a shared worker of the first test region does (cron's
    ``celery`` queue and the region's fast and slow check queues: a worker serves one region);
    no ping task (checkbeat's app registers none)."""
    from celery_app.redis.schema import check_queue

    region = settings.regions[0]
    lanes = [check_queue(region, lane) for lane in ("fast", "slow")]
    return {
        "concurrency": max(2, settings.check_partitions),  # a slot in every partition
        "perform_ping_check": False,
        "shutdown_timeout": 20,
        "queues": ["celery", *lanes],
    }


@pytest.fixture
def app(make_app, test_kind, request: pytest.FixtureRequest):
    """The app a module's tests share: ``make_app`` with the settings its ``app_settings``
    marker names (``pytestmark = pytest.mark.app_settings(regions=["eu"], dispatch_lead=0.2)``),
    the test kind registered."""
    marker = request.node.get_closest_marker("app_settings")
    return make_app(**(marker.kwargs if marker else {}))


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
    """Factory: run_worker(app, queues, concurrency) starts an in-process threads-pool worker
    (with at least one slot per partition of the check half);
    ``run_worker.stop()`` stops every worker it started so far (any left stop after the test).

    Stop one worker before starting the next. Two in-process workers share kombu's event loop
    (``kombu.asynchronous.get_event_loop``: the second worker's Hub step takes the first's) and
    Celery's shutdown flag (``celery.worker.state.should_terminate``): one worker's thread then
    reads the other's BRPOP reply, and the other hangs in ``Channel.close`` waiting for it
    (5 of 20 runs of test_run_task's two-worker test did). On the same queues they would also take
    each other's messages. A worker process has one of each, so only tests meet this.
    """
    from contextlib import ExitStack

    from celery.contrib.testing.worker import start_worker

    import workers.tasks  # noqa: F401 - the run task and its signal handlers

    with ExitStack() as stack:

        def run(app, queues: list[str], concurrency: int = 2, hostname: str | None = None):
            from support.partitions import partitions_of

            return stack.enter_context(
                start_worker(
                    app,
                    pool="threads",
                    # a slot in every partition of the check half (a worker's slots are shared
                    # out among them): with one partition, exactly ``concurrency``
                    concurrency=max(concurrency, partitions_of(app)),
                    perform_ping_check=False,
                    shutdown_timeout=30,
                    queues=queues,
                    loglevel="INFO",
                    **({"hostname": hostname} if hostname else {}),
                )
            )

        run.stop = stack.close
        yield run


@pytest.fixture
def allow_private(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CHECKBEAT_ALLOW_PRIVATE_TARGETS=1 for this process (checks on 127.0.0.1 may be created)."""
    from celery_app.settings import get_settings

    monkeypatch.setenv("CHECKBEAT_ALLOW_PRIVATE_TARGETS", "1")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def claim():
    """:func:`support.workers.claim_by_hand` as a fixture."""
    return claim_by_hand


@pytest.fixture
def dispatching() -> Iterator:
    """Factory: dispatching(app, interval=0.1) -> a started Ticker of every partition's
    dispatcher, stopped after the test."""
    from support.partitions import dispatchers

    tickers: list[Ticker] = []

    def start(app, interval: float = 0.1) -> Ticker:
        ticker = Ticker(dispatchers(app), interval).start()
        tickers.append(ticker)
        return ticker

    yield start
    for ticker in tickers:
        ticker.stop()
