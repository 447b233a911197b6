"""Shared fixtures: one real redis-server per test session, isolated per test.

The server starts in ``pytest_configure``, before any test module imports ``celery_app``, so the
app and every helper read its URL from the environment exactly as a deployment would. Broker
messages use db 0 and checkbeat's state db 1; each test starts with an empty state db.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

if TYPE_CHECKING:
    # Importing any celery_app module builds the app from the environment, so the real import
    # waits until pytest_configure has pointed the environment at the test server.
    from celery_app.local.embedded_redis import RedisServer

_server: RedisServer | None = None
_tmp: str | None = None

BROKER_DB = 0
STATE_DB = 1


def pytest_configure(config: pytest.Config) -> None:
    global _server, _tmp
    if _server is not None:
        return
    _tmp = tempfile.mkdtemp(prefix="checkbeat-test-redis-")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ["CHECKBEAT_REDIS_URL"] = f"redis://127.0.0.1:{port}/{STATE_DB}"
    os.environ["CHECKBEAT_BROKER_URL"] = f"redis://127.0.0.1:{port}/{BROKER_DB}"
    os.environ.setdefault("CHECKBEAT_KEY_PREFIX", "cbtest")
    from celery_app.local.embedded_redis import RedisServer

    _server = RedisServer(Path(_tmp), port=port).start()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


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


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
