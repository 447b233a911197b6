"""One redis-py client per URL and TLS options per process, for checkbeat's state (not the
broker's).

Why the settings are an argument: the TLS options of a ``rediss://`` URL come from the settings
of the app in hand, so an app built with ``create_app(settings)`` connects as those settings say,
never as the environment of the process does.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_app.cluster_url import is_cluster_url
from celery_app.redis.pipelined_scripts import ScriptClient
from celery_app.redis.sentinel import (
    is_sentinel_url,
    parse_sentinel_url,
    sentinel_kwargs,
    sentinel_tls_kwargs,
)
from celery_app.redis.tls import redis_tls_kwargs
from celery_app.settings import Settings

#: Under Sentinel a failover takes the Sentinels' down-after time plus an election: a call retries
#: a dropped or read-only connection with a backoff capped at 1 s, about 4 s in all, each retry
#: asking the Sentinels for the master again; past that the caller's own loop retries.
FAILOVER_RETRIES = 7
FAILOVER_ERRORS = [redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError]

_clients: dict[tuple[str, tuple[Any, ...]], redis.Redis] = {}
_lock = threading.Lock()
_inherited: list[redis.Redis] = []


def _forget_clients_in_child() -> None:
    """A forked child (a prefork pool process) starts with clients of its own. Its parent's
    pools are unusable there: a pool lock that a parent thread (the capacity heartbeat, a
    scrape) held at the fork stays held forever in the child, and redis-py's own fork check
    takes it (a run hung in ``ConnectionPool._checkpid`` until its soft time limit). The
    inherited clients are kept, never closed: closing takes those locks, and their sockets are
    the parent's."""
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_clients.values())
    _clients.clear()


os.register_at_fork(after_in_child=_forget_clients_in_child)


def get_redis(url: str, settings: Settings) -> redis.Redis:
    """A shared, thread-safe client (redis-py pools connections) that decodes to ``str``.

    Clients retry a dropped connection once and keep TCP keepalive on, so a Redis restart
    costs one failed call at most, not a restart of beat or the workers. A ``rediss://`` URL
    verifies the server certificate per the ``redis_tls_*`` settings (see celery_app.redis.tls);
    clients are shared per (url, :func:`connection_identity`), so two apps that differ only in
    TLS (or Sentinel master) never share one.
    """
    tls = redis_tls_kwargs(url, settings)
    key = (url, connection_identity(settings))
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _connect(url, settings, tls, decode_responses=True)
                _clients[key] = client
    return client


def connection_identity(settings: Settings) -> tuple[Any, ...]:
    """The settings besides the URL that a client connects by: TLS (of ``rediss://``, a
    cluster's nodes, or a Sentinel deployment) and the Sentinel master and password. Clients
    are shared only when these match (a Sentinel URL's TLS is not in ``redis_tls_kwargs``)."""
    return (
        settings.redis_tls_cert_reqs,
        settings.redis_tls_ca_file,
        settings.redis_tls_certfile,
        settings.redis_tls_keyfile,
        settings.redis_sentinel_tls,
        settings.redis_sentinel_master,
        settings.redis_sentinel_password,
    )


def _connect(url: str, settings: Settings, tls: dict[str, Any], **options: Any) -> redis.Redis:
    if is_sentinel_url(url):
        return sentinel_master(url, settings, **options)
    if is_cluster_url(url):
        from celery_app.redis.cluster import cluster_client

        return cluster_client(url, settings, **options)  # type: ignore[return-value]  # used as one
    from celery_app.redis.replication import mark_client

    client = ScriptClient.from_url(
        url,
        socket_keepalive=True,
        health_check_interval=30,
        retry_on_timeout=True,
        **tls,
        **options,
    )
    return mark_client(client, settings, sentinel=False)


def sentinel_master(url: str, settings: Settings, **options: Any) -> redis.Redis:
    """A client of the master the Sentinels of ``url`` name (``CHECKBEAT_REDIS_SENTINEL_MASTER``).

    Every new connection asks the Sentinels where the master is, and a connection to a node
    that was demoted fails (redis-py turns its READONLY into a ConnectionError), so a retried
    call lands on the promoted replica: beat and workers follow a failover without a restart.
    The client is also marked with the replicas to WAIT for (celery_app.redis.replication).
    """
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(
        list(parsed.hosts),
        sentinel_kwargs=sentinel_kwargs(settings),
        socket_timeout=5.0,
        socket_connect_timeout=1.0,
        socket_keepalive=True,
        **sentinel_tls_kwargs(settings),
    )
    client = sentinel.master_for(
        settings.redis_sentinel_master,
        redis_class=ScriptClient,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), FAILOVER_RETRIES),
        retry_on_error=FAILOVER_ERRORS,
        health_check_interval=30,
        **parsed.node_kwargs(),
        **options,
    )
    from celery_app.redis.replication import mark_client

    return mark_client(client, settings, sentinel=True)


def reset_clients() -> None:
    """Close every cached client (tests, and after a fork)."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
