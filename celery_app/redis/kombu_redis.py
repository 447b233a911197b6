"""kombu's Redis transport, with one redis-py client per channel pool instead of one per call.

Why: kombu's Redis channel builds a new ``redis.Redis`` for every publish, ack and queue operation
(``Channel.conn_or_acquire`` -> ``_create_client``), and redis-py 8's constructor builds its whole
response-callback table each time. A worker makes four or five such calls per message (the unacked
record, the ack, the task events): a large share of a check run's worker CPU
(``bench/broker_bench.py`` measures it). A ``redis.Redis`` is thread-safe (each command takes a
connection from the pool), so the channel keeps one per pool and builds a new one only when kombu
replaced the pool (after a connection error). It also refuses to build a pool for a connection kombu
has let go of (:meth:`SharedClient._get_pool`): a connection error there, not a worker exit. A
message consumed without acks is not "acked" with a round trip either (:class:`AcksOnlyRecorded`).

Registered as kombu's ``redis`` and ``rediss`` transports by :func:`register` (the app factory
and ``install`` call it), unless something else registered those names already; the Sentinel
transport (:mod:`celery_app.redis.kombu_sentinel`) shares :class:`SharedClient`.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

ALIASES = ("redis", "rediss")
KOMBU_TRANSPORT = "kombu.transport.redis:Transport"
TRANSPORT = "celery_app.redis.kombu_redis:Transport"


class SharedClient:
    """Mixin for a kombu Redis channel: ``_create_client`` returns the one client of the
    channel's current pool (the asynchronous client kombu already keeps once), and no pool is
    built for a connection that is gone (see :meth:`_get_pool`)."""

    _shared_client: Any = None

    def _get_pool(self, asynchronous: bool = False) -> Any:
        """kombu's, unless the transport has let go of its connection: then a connection error.

        Why: when the broker goes away with a message unacked, the consumer closes its
        connection, and the channel's close restores the unacked messages, asking for a pool
        after kombu dropped the old one and detached the transport. kombu then fails with
        ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which Celery's
        consumer does not catch: the worker exited (seen in tests/faults/test_broker_outage.py,
        kombu issue #582). A connection error is what the close ignores; the worker reconnects,
        and the unacked messages stay in Redis for the transport's own restore.
        """
        if self.connection.client is None:  # type: ignore[attr-defined]  # a mixin
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._get_pool(asynchronous=asynchronous)  # type: ignore[misc]  # a mixin

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]  # a mixin
        pool = self.pool  # type: ignore[attr-defined]  # a mixin
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]  # a mixin
        return client


class AcksOnlyRecorded:
    """Mixin for a kombu Redis channel: the ack or reject of a message its queue delivered
    without acks (``Queue.no_ack``: checkbeat's check queues, :mod:`workers.worker_step`)
    sends nothing.

    Why: kombu writes a delivery to its unacked hash only when the queue is consumed with acks,
    but its ack and reject always send the MULTI/ZREM/HDEL/EXEC that removes it, and Celery
    acks every task. A check run would pay that round trip to remove what was never written.
    A reject that asks to requeue such a message has no copy to put back: the message is gone
    (a check run's lease brings the job back instead).
    """

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if delivery_tag in self.qos._delivered:  # type: ignore[attr-defined]  # a mixin
            super().basic_ack(delivery_tag, multiple=multiple)  # type: ignore[misc]  # a mixin

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if delivery_tag in self.qos._delivered:  # type: ignore[attr-defined]  # a mixin
            super().basic_reject(delivery_tag, requeue=requeue)  # type: ignore[misc]  # a mixin


class Channel(AcksOnlyRecorded, SharedClient, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


def register() -> None:
    """Make ``redis://`` and ``rediss://`` broker URLs use :class:`Transport` in this process
    (a name some other code registered a transport of its own under is left alone)."""
    for alias in ALIASES:
        if TRANSPORT_ALIASES.get(alias) == KOMBU_TRANSPORT:
            TRANSPORT_ALIASES[alias] = TRANSPORT
