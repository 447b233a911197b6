"""One redis-py client per URL per process, for checkbeat's state (not the broker's)."""

from __future__ import annotations

import threading

import redis

from celery_app.redis.tls import is_tls_url, redis_tls_kwargs
from celery_app.settings import get_settings

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def get_redis(url: str) -> redis.Redis:
    """A shared, thread-safe client (redis-py pools connections) that decodes to ``str``.

    Clients retry a dropped connection once and keep TCP keepalive on, so a Redis restart
    costs one failed call at most, not a restart of beat or the workers. A ``rediss://`` URL
    verifies the server certificate per ``CHECKBEAT_REDIS_TLS_*`` (see celery_app.redis.tls).
    """
    client = _clients.get(url)
    if client is None:
        with _lock:
            client = _clients.get(url)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    decode_responses=True,
                    socket_keepalive=True,
                    health_check_interval=30,
                    retry_on_timeout=True,
                    **(redis_tls_kwargs(url, get_settings()) if is_tls_url(url) else {}),
                )
                _clients[url] = client
    return client


def reset_clients() -> None:
    """Close every cached client (tests, and after a fork)."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
