"""One redis-py client per URL and TLS options per process, for checkbeat's state (not the
broker's).

Why the settings are an argument: the TLS options of a ``rediss://`` URL come from the settings
of the app in hand, so an app built with ``create_app(settings)`` connects as those settings say,
never as the environment of the process does.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from celery_app.redis.tls import redis_tls_kwargs
from celery_app.settings import Settings

_clients: dict[tuple[str, tuple[tuple[str, Any], ...]], redis.Redis] = {}
_lock = threading.Lock()


def get_redis(url: str, settings: Settings) -> redis.Redis:
    """A shared, thread-safe client (redis-py pools connections) that decodes to ``str``.

    Clients retry a dropped connection once and keep TCP keepalive on, so a Redis restart
    costs one failed call at most, not a restart of beat or the workers. A ``rediss://`` URL
    verifies the server certificate per the ``redis_tls_*`` settings (see celery_app.redis.tls);
    clients are shared per (url, TLS options), so two apps that differ only in TLS never share one.
    """
    tls = redis_tls_kwargs(url, settings)
    key = (url, tuple(sorted(tls.items())))
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    decode_responses=True,
                    socket_keepalive=True,
                    health_check_interval=30,
                    retry_on_timeout=True,
                    **tls,
                )
                _clients[key] = client
    return client


def reset_clients() -> None:
    """Close every cached client (tests, and after a fork)."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
