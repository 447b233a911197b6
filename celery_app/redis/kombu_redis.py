"""kombu's Redis transport, with one redis-py client per channel pool instead of one per call.

Why: kombu's Redis channel builds a new ``redis.Redis`` for every publish, ack and queue
operation (``Channel.conn_or_acquire`` -> ``_create_client``), and redis-py 8's constructor
builds its whole response-callback table each time (about 0.3 ms here). A worker makes four or
five such calls per message (the unacked record, the ack, the task events), over a millisecond of
a check run's worker CPU. A ``redis.Redis`` is thread-safe (each command takes a connection from
the pool), so the channel keeps one per pool and builds a new one only when kombu replaced the
pool (after a connection error).

Registered as kombu's ``redis`` and ``rediss`` transports by :func:`register` (the app factory
and ``install`` call it), unless something else registered those names already; the Sentinel
transport (:mod:`celery_app.redis.kombu_sentinel`) shares :class:`SharedClient`.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

ALIASES = ("redis", "rediss")
KOMBU_TRANSPORT = "kombu.transport.redis:Transport"
TRANSPORT = "celery_app.redis.kombu_redis:Transport"


class SharedClient:
    """Mixin for a kombu Redis channel: ``_create_client`` returns the one client of the
    channel's current pool (the asynchronous client kombu already keeps once)."""

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool  # type: ignore[attr-defined]
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client


class Channel(SharedClient, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


def register() -> None:
    """Make ``redis://`` and ``rediss://`` broker URLs use :class:`Transport` in this process
    (a name some other code registered a transport of its own under is left alone)."""
    for alias in ALIASES:
        if TRANSPORT_ALIASES.get(alias) == KOMBU_TRANSPORT:
            TRANSPORT_ALIASES[alias] = TRANSPORT
