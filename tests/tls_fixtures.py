"""Fixtures of the TLS tests (a pytest plugin listed in tests/conftest.py): certificates, a
TLS-only redis-server and a TLS-only Sentinel deployment, each skipped with the reason when no
redis-server built with TLS is installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.tls_redis import (
    TlsFiles,
    TlsRedisServer,
    TlsSentinelDeployment,
    find_tls_redis_server,
    make_tls_files,
)

from celery_app.redis.client import reset_clients


@pytest.fixture(scope="session")
def tls_redis_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A redis-server built with TLS (Debian's), or the test is skipped saying why."""
    binary, reason = find_tls_redis_server(str(tmp_path_factory.mktemp("tls-probe")))
    if binary is None:
        pytest.skip(reason)
    return binary


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    """A fresh CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def tls_redis(tmp_path: Path, tls_redis_binary: str, tls_files: TlsFiles) -> Iterator:
    """One redis-server listening on TLS only (``rediss://``), stopped after the test."""
    server = TlsRedisServer(tmp_path / "tls-redis", tls_redis_binary, tls_files).start()
    try:
        yield server
    finally:
        reset_clients()
        server.stop()


@pytest.fixture
def tls_sentinel_deployment(
    tmp_path: Path, tls_redis_binary: str, tls_files: TlsFiles
) -> Iterator[TlsSentinelDeployment]:
    """A master, a replica and three Sentinels, all TLS-only, stopped after the test."""
    deployment = TlsSentinelDeployment(tmp_path / "tls-sentinel", tls_redis_binary, tls_files)
    try:
        yield deployment.start()
    finally:
        reset_clients()
        deployment.stop()
