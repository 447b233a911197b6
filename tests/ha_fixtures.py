"""Fixtures of the high-availability tests (a pytest plugin listed in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cluster import LocalCluster
from support.sentinel import SentinelDeployment

from celery_app.redis.client import reset_clients


@pytest.fixture
def sentinel_deployment(tmp_path) -> Iterator[SentinelDeployment]:
    """One master, one replica and three Sentinels on loopback, stopped after the test."""
    deployment = SentinelDeployment(tmp_path / "sentinel").start()
    try:
        yield deployment
    finally:
        reset_clients()
        deployment.stop()


@pytest.fixture
def redis_cluster(tmp_path) -> Iterator[LocalCluster]:
    """Three Redis Cluster masters on loopback (slots assigned by the test), stopped after."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    try:
        yield cluster
    finally:
        reset_clients()
        cluster.stop()


@pytest.fixture
def redis_cluster_with_replicas(tmp_path) -> Iterator[LocalCluster]:
    """Three Redis Cluster masters on loopback, each with one replica (a failover promotes
    it), stopped after."""
    cluster = LocalCluster(tmp_path / "cluster", replicas_per_master=1).start()
    try:
        yield cluster
    finally:
        reset_clients()
        cluster.stop()
