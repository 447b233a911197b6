"""kombu's Redis Sentinel transport, with the one fix a failover needs.

Why: when the master dies, the worker's consumer closes its broker connection and the channel's
close restores the messages it had delivered but not acked (``QoS.restore_unacked``). By then
the channel has dropped its pool and kombu rebuilds it from connection info that is already
gone: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` (kombu#582, #970), which
Celery treats as unrecoverable, so the worker exits instead of following the failover. An ack
(or reject) of a message delivered on the old channel and finished after the reconnection fails
the same way. Here the restore, the ack and the reject give up instead: the messages stay in
kombu's unacked hash, from where any consumer restores them after the visibility timeout; by
then a check's lease has been reaped (the run is recorded as lost and the stale message is
discarded) and a cron message has expired.

Registered as kombu's ``sentinel`` transport by :func:`register` (the app factory calls it), so
every ``sentinel://`` broker URL of the process uses it. Its channel also keeps one redis-py
client per pool (:class:`~celery_app.redis.kombu_redis.SharedClient`) and sends no ack for a
message consumed without acks (:class:`~celery_app.redis.kombu_redis.AcksOnlyRecorded`).
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.base import QoS as _VirtualQoS

from celery_app.redis.kombu_redis import AcksOnlyRecorded, SharedClient

log = logging.getLogger(__name__)

ALIAS = "sentinel"
TRANSPORT = "celery_app.redis.kombu_sentinel:SentinelTransport"


def kombu_virtual_qos_ack(qos: _VirtualQoS, delivery_tag: Any) -> None:
    _VirtualQoS.ack(qos, delivery_tag)


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> Any:
        try:
            return super().restore_unacked(client)
        except AttributeError:
            delivered: Any = self._delivered  # set by kombu's QoS.__init__, never None
            log.warning(
                "checkbeat: %d unacked message(s) left to the visibility timeout: the broker "
                "connection was already gone (failover)",
                len(delivered),
            )
            delivered.clear()
            return None

    def ack(self, delivery_tag: Any) -> None:
        try:
            super().ack(delivery_tag)
        except AttributeError:
            self._gone(delivery_tag, "ack")

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)
        except AttributeError:
            self._gone(delivery_tag, "reject")

    def _gone(self, delivery_tag: Any, what: str) -> None:
        log.warning(
            "checkbeat: %s of message %s left to the visibility timeout: its broker "
            "connection was already gone (failover)",
            what,
            delivery_tag,
        )
        # forget it here (the virtual QoS's bookkeeping only, no Redis call)
        kombu_virtual_qos_ack(self, delivery_tag)


class SentinelChannel(AcksOnlyRecorded, SharedClient, kombu_redis.SentinelChannel):
    QoS = QoS


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def register() -> None:
    """Make ``sentinel://`` broker URLs use :class:`SentinelTransport` in this process."""
    TRANSPORT_ALIASES[ALIAS] = TRANSPORT
