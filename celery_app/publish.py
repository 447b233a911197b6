"""Publish many Celery task messages in one Redis round trip.

Why not ``apply_async`` in a loop: kombu's Redis transport costs ~430 µs per publish (a new
redis-py client each time), ~2,350 messages/s; the dispatcher and the cron engine need several
thousand per second. Two batched paths, both producing exactly the envelope Celery's own
``send_task`` produces (protocol 2, JSON body, base64 body encoding, anonymous exchange, routing
key = queue), so an ordinary Celery worker consumes them:

- :class:`RedisBatchPublisher` (default for ``redis://`` / ``rediss://`` brokers): builds each
  envelope in Python and LPUSHes them all onto the kombu queue lists in one pipeline.
- :class:`KombuBatchPublisher` (any other broker, or a Redis broker with a
  ``global_keyprefix`` or priority queues configured): ``send_task_message`` inside kombu 5.7's
  ``Producer.batch(max_size=...)``, which pipelines the publishes on Redis.

Neither sends ``task-sent`` events (the workers' events are what Flower shows). Use
:func:`make_publisher` to get the right one for an app.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import redis
from celery import Celery

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_REPR_MAX = 1024


@dataclass(frozen=True)
class TaskMessage:
    """One task to publish by name (the task may live in a process that is not this one)."""

    name: str
    queue: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()
    time_limit: float | None = None
    soft_time_limit: float | None = None
    expires: datetime | None = None
    task_id: str | None = None


class Publisher(Protocol):
    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        """Publish all messages; return their task ids, in order."""
        ...


def _origin() -> str:
    return f"gen{os.getpid()}@{socket.gethostname()}"


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _num(value: float | None) -> str:
    return "null" if value is None else _dumps(value)


def encode_envelope(message: TaskMessage, task_id: str, origin: str, delivery_tag: str) -> str:
    """The kombu Redis envelope of a protocol-2 Celery task message, as a JSON string.

    Field for field what ``send_task`` + kombu's Redis transport write (see the module
    docstring); assembled from pre-escaped pieces because this runs once per message.
    """
    args = list(message.args)
    body = _dumps([args, message.kwargs, _EMBED])
    expires = _dumps(message.expires.isoformat()) if message.expires else "null"
    return "".join(
        (
            '{"body":"',
            base64.b64encode(body.encode()).decode("ascii"),
            '","content-encoding":"utf-8","content-type":"application/json","headers":{'
            '"lang":"py","task":',
            _dumps(message.name),
            ',"id":"',
            task_id,
            '","shadow":null,"eta":null,"expires":',
            expires,
            ',"group":null,"group_index":null,"retries":0,"timelimit":[',
            _num(message.time_limit),
            ",",
            _num(message.soft_time_limit),
            '],"root_id":"',
            task_id,
            '","parent_id":null,"argsrepr":',
            _dumps(repr(tuple(args))[:_REPR_MAX]),
            ',"kwargsrepr":',
            _dumps(repr(message.kwargs)[:_REPR_MAX]),
            ',"origin":',
            origin,
            ',"ignore_result":false,"replaced_task_nesting":0,"stamped_headers":null,'
            '"stamps":{}},"properties":{"correlation_id":"',
            task_id,
            '","reply_to":"","delivery_mode":2,"delivery_info":{"exchange":"","routing_key":',
            _dumps(message.queue),
            '},"priority":0,"body_encoding":"base64","delivery_tag":"',
            delivery_tag,
            '"}}',
        )
    )


class UniqueIds:
    """UUID-shaped ids, unique per process: one random base plus a counter.

    ``uuid4()`` per message costs more than the rest of the envelope; task ids and delivery
    tags only need to be unique, and these are (128 random bits of base, 48 bits of counter).
    """

    def __init__(self) -> None:
        self._base = uuid.uuid4().int & ~((1 << 48) - 1)
        self._counter = itertools.count()

    def __call__(self) -> str:
        h = f"{self._base | (next(self._counter) & ((1 << 48) - 1)):032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class RedisBatchPublisher:
    """LPUSH prepared envelopes onto the queue lists, one pipeline per call.

    A list key is the queue name (priority 0 on kombu's Redis transport): exactly where
    ``send_task(..., queue=q)`` puts a message, and where a worker consuming ``q`` BRPOPs.
    """

    def __init__(self, broker_url: str, *, chunk: int = 5000, **client_options: Any) -> None:
        self.client = redis.Redis.from_url(broker_url, **client_options)
        self.origin = _dumps(_origin())
        self.chunk = chunk
        self.ids = UniqueIds()

    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        ids: list[str] = []
        by_queue: dict[str, list[str]] = {}
        pipe = self.client.pipeline(transaction=False)
        pending = 0
        for message in messages:
            task_id = message.task_id or self.ids()
            ids.append(task_id)
            by_queue.setdefault(message.queue, []).append(
                encode_envelope(message, task_id, self.origin, self.ids())
            )
            pending += 1
            if pending >= self.chunk:
                self._flush(pipe, by_queue)
                by_queue, pending = {}, 0
        if pending:
            self._flush(pipe, by_queue)
        return ids

    @staticmethod
    def _flush(pipe: Any, by_queue: dict[str, list[str]]) -> None:
        for queue, payloads in by_queue.items():
            pipe.lpush(queue, *payloads)
        pipe.execute()

    def close(self) -> None:
        self.client.close()


class KombuBatchPublisher:
    """Celery's own ``send_task_message`` inside kombu's ``Producer.batch`` (any broker)."""

    def __init__(self, app: Celery, *, max_size: int = 1000) -> None:
        self.app = app
        self.max_size = max_size

    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        amqp = self.app.amqp
        ids = []
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=self.max_size):
            for message in messages:
                task_id = message.task_id or str(uuid.uuid4())
                ids.append(task_id)
                task = amqp.create_task_message(
                    task_id,
                    message.name,
                    message.args,
                    message.kwargs,
                    time_limit=message.time_limit,
                    soft_time_limit=message.soft_time_limit,
                    expires=message.expires,
                )
                amqp.send_task_message(
                    producer, message.name, task, queue=message.queue, send_sent_event=False
                )
        return ids

    def close(self) -> None:
        pass


def fast_path_supported(app: Celery) -> bool:
    """Whether :class:`RedisBatchPublisher` writes where this app's workers read."""
    url = app.conf.broker_url or ""
    options = app.conf.broker_transport_options or {}
    return (
        url.split("://", 1)[0] in ("redis", "rediss")
        and not options.get("global_keyprefix")
        and not options.get("priority_steps")
        and options.get("queue_order_strategy") != "priority"
    )


def make_publisher(app: Celery) -> Publisher:
    """The fastest publisher that is correct for this app's broker."""
    if fast_path_supported(app):
        from celery_app.factory import settings_of
        from celery_app.redis.tls import redis_tls_kwargs

        url = app.conf.broker_url
        return RedisBatchPublisher(url, **redis_tls_kwargs(url, settings_of(app)))
    return KombuBatchPublisher(app)


def publish_all(app: Celery, messages: Iterable[TaskMessage]) -> list[str]:
    """One-shot convenience: publish with a fresh publisher."""
    publisher = make_publisher(app)
    try:
        return publisher.publish(list(messages))
    finally:
        publisher.close()  # type: ignore[attr-defined]
