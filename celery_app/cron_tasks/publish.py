"""Publishing cron messages: many at once, through one producer and one Redis pipeline.

Why not ``apply_async`` in a loop: kombu's Redis transport builds a client per publish, about
2,350 messages/s. Inside kombu's ``Producer.batch`` the LPUSHes of many messages share one
pipelined round trip. Each message is a normal Celery protocol-2 task message (built by
``app.amqp``), so any worker runs it.

Every message carries the window's deadline as ``expires`` (a message stuck in a dead broker must
not run hours late), the task's timeout as soft and hard time limits, and ``cron_*`` headers the
worker's signal handlers use to record the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import uuid4

from celery import Celery
from kombu.common import maybe_declare
from kombu.serialization import dumps
from kombu.utils.json import dumps as json_dumps

from celery_app.cron_tasks.registration import CronTask
from celery_app.cron_tasks.store import FireRequest, window_deadline

BATCH_MAX = 2000  # Redis commands buffered before kombu flushes the pipeline
LPUSH_CHUNK = 1000  # messages per multi-value LPUSH

HEADER_TASK = "cron_task"
HEADER_TENANT = "cron_tenant"
HEADER_WINDOW = "cron_window"
HEADER_MANUAL = "cron_manual"


class CronPublisher:
    """Sends fired cron tasks to the broker; raises if the batch could not be published.

    Fast path (kombu's Redis transport, direct queues): the Celery headers come from
    ``app.amqp.as_task_v2`` once per task and window, the kombu envelope from the channel's own
    ``prepare_message``, and all messages of a queue go out as multi-value LPUSHes in one
    pipeline. Any other transport or exchange type uses kombu's ``Producer.batch``.
    """

    def __init__(self, app: Celery, grace: timedelta) -> None:
        self.app = app
        self.grace = grace
        self._routes: dict[str, dict[str, Any]] = {}
        self._queues: dict[str, str | None] = {}

    def _route(self, task: CronTask) -> dict[str, Any]:
        route = self._routes.get(task.name)
        if route is None:
            task_type = self.app.tasks.get(task.name)
            route = dict(self.app.amqp.router.route({}, task.name, (), {}, task_type))
            self._routes[task.name] = route
        return route

    def _direct_queue(self, task: CronTask) -> str | None:
        """The queue a task's messages go to, or None when it is not a plain direct queue."""
        if task.name not in self._queues:
            route = self._route(task)
            queue = route.get("queue") or self.app.amqp.default_queue
            if isinstance(queue, str):
                queue = self.app.amqp.queues[queue]
            direct = queue.exchange.type == "direct" and not route.get("exchange")
            self._queues[task.name] = queue.name if direct else None
        return self._queues[task.name]

    def prepare(self, tasks: Sequence[CronTask]) -> None:
        """Resolve every task's route once, so the first window publishes as fast as the rest."""
        for task in tasks:
            self._direct_queue(task)

    def publish(self, requests: Sequence[FireRequest], *, manual: bool = False) -> list[str]:
        """Publish one message per request; return the Celery task ids, in order."""
        if not requests:
            return []
        with self.app.producer_or_acquire() as producer:
            channel = producer.channel
            if hasattr(channel, "_q_for_pri") and hasattr(channel, "conn_or_acquire"):
                return self._publish_redis(producer, requests, manual)
            return self._publish_kombu(producer, requests, manual)

    def _headers(self, req: FireRequest, manual: bool) -> dict[str, Any]:
        return {
            HEADER_TASK: req.task.id,
            HEADER_TENANT: req.tenant,
            HEADER_WINDOW: req.window_id,
            HEADER_MANUAL: manual,
        }

    def _message(self, req: FireRequest, celery_id: str) -> Any:
        task = req.task
        kwargs = {"tenant": req.tenant} if task.per_tenant else {}
        return self.app.amqp.as_task_v2(
            celery_id,
            task.name,
            args=(),
            kwargs=kwargs,
            expires=window_deadline(req.window, self.grace).isoformat(),
            time_limit=task.hard_time_limit,
            soft_time_limit=task.soft_time_limit,
            argsrepr="()",
            kwargsrepr=repr(kwargs),
        )

    def _publish_kombu(
        self, producer: Any, requests: Sequence[FireRequest], manual: bool
    ) -> list[str]:
        amqp = self.app.amqp
        ids: list[str] = []
        with producer.batch(max_size=BATCH_MAX):
            for req in requests:
                celery_id = str(uuid4())
                amqp.send_task_message(
                    producer,
                    req.task.name,
                    self._message(req, celery_id),
                    retry=False,
                    headers=self._headers(req, manual),
                    **self._route(req.task),
                )
                ids.append(celery_id)
        return ids

    def _publish_redis(
        self, producer: Any, requests: Sequence[FireRequest], manual: bool
    ) -> list[str]:
        channel = producer.channel
        serializer = self.app.conf.task_serializer
        # Celery's headers and kombu's envelope differ between our messages only in the fields
        # patched below, so app.amqp and the channel build them once per window and queue (the
        # format stays theirs) and each message copies and patches its own.
        templates: dict[tuple[str, str], tuple[Any, ...]] = {}
        per_key: dict[str, list[str]] = {}
        ids: list[str] = []
        for req in requests:
            task = req.task
            qname = self._direct_queue(task)
            if qname is None:
                return self._publish_kombu(producer, requests, manual)
            celery_id = str(uuid4())
            template = templates.get((req.window_id, qname))
            if template is None:
                maybe_declare(self.app.amqp.queues[qname], channel)
                headers, properties, body, _ = self._message(req, celery_id)
                properties = {k: v for k, v in properties.items() if v is not None}
                properties["delivery_mode"] = 2
                content_type, encoding, payload = dumps(body, serializer=serializer)
                envelope = channel.prepare_message(
                    payload, 0, content_type, encoding, headers, properties
                )
                channel._inplace_augment_message(envelope, "", qname)
                batch = per_key.setdefault(channel._q_for_pri(qname, 0), [])
                template = (envelope, headers, body[2], batch)
                templates[(req.window_id, qname)] = template
            envelope, base_headers, embed, batch = template
            kwargs = {"tenant": req.tenant} if task.per_tenant else {}
            headers = {
                **base_headers,
                "task": task.name,
                "id": celery_id,
                "root_id": celery_id,
                "timelimit": [task.hard_time_limit, task.soft_time_limit],
                "kwargsrepr": repr(kwargs),
                HEADER_TASK: task.id,
                HEADER_TENANT: req.tenant,
                HEADER_WINDOW: req.window_id,
                HEADER_MANUAL: manual,
            }
            if serializer == "json":  # what kombu's json serializer does, minus its registry
                payload = json_dumps(((), kwargs, embed))
            else:
                _, _, payload = dumps(((), kwargs, embed), serializer=serializer)
            props = envelope["properties"]
            message = {
                **envelope,
                "body": channel.encode_body(payload, props.get("body_encoding"))[0],
                "headers": headers,
                "properties": {
                    **props,
                    "correlation_id": celery_id,
                    # Unique per message, as kombu's own uuid is; the task id already is one.
                    "delivery_tag": celery_id,
                },
            }
            batch.append(json_dumps(message))
            ids.append(celery_id)
        with channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            for key, payloads in per_key.items():
                for start in range(0, len(payloads), LPUSH_CHUNK):
                    pipe.lpush(key, *payloads[start : start + LPUSH_CHUNK])
            pipe.execute()
        return ids
