"""The one publisher of checkbeat: many Celery task messages per call, cron windows and checks.

Why not ``apply_async`` in a loop: kombu's Redis transport builds a new redis-py client for
each publish, and even kombu 5.7's ``Producer.batch`` around Celery's own ``send_task_message``
stays an order of magnitude below what beat needs (``python -m bench.dispatch_bench`` prints
them side by side): it fires 10,000 cron windows and dispatches tens of thousands of checks in a
second. So there are two paths behind :func:`make_publisher`, one message format:

- the Redis fast path (a ``redis://`` / ``rediss://`` broker without ``global_keyprefix`` or
  priority queues, JSON serializer, a message routed to a plain direct queue): each envelope is
  written by :func:`encode_envelope` and all of them are LPUSHed onto the queue lists in one
  pipeline; ``tests/test_publish.py`` checks it field by field against what ``send_task`` puts
  on the same queue, and that a real worker runs it;
- Celery's public path for everything else: ``app.amqp.create_task_message`` and
  ``send_task_message`` inside kombu's ``Producer.batch`` (kombu >= 5.7).

Messages are routed by the app's router (``task_routes``, a cron task's declared queue) unless
they name their queue; routes are resolved once per (task name, queue) and cached. Neither path
sends ``task-sent`` events for checkbeat's own messages (the workers' events are what Flower
shows).

A message marked ``as_apply_async`` (every cron window) is the one ``Task.apply_async`` sends, as
Celery's beat (``Scheduler.apply_async``) sends an entry: the task's own execution options (its
time limits, ``ignore_result``, priority, routing, serializer, set on the task, by
``task_annotations`` or by the ``task_*`` settings) apply under the message's own. Celery's public
path takes ``apply_async``'s own steps (``app.send_task`` for a task this process does not
register, as beat does), so every option, signal and event is Celery's; only its refusals are
left out (arguments that do not fit the task's signature, a soft time limit over the hard one):
such a window is sent and fails on the worker, where raising would fail the whole batch. The
fast path takes such a message only when the task's options are ones its envelope reproduces
(``tests/test_beat_messages.py`` holds both against ``Scheduler.apply_async``).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import redis
from celery import Celery, signals
from celery.app.task import (  # type: ignore[attr-defined]  # not in celery-types
    Task,
    extract_exec_options,
)
from celery.utils.saferepr import saferepr
from kombu.utils.json import JSONEncoder

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_REPR_MAX = 1024  # Celery's argsrepr_maxsize / kwargsrepr_maxsize
_PERSISTENT = 2  # kombu's delivery mode of a persistent message (the fast path's only one)
# A route of only these options puts a message on the anonymous exchange, routing key = queue.
_PLAIN_ROUTE = frozenset({"queue", "routing_key"})
#: Envelope parts kept per publisher (a task to a queue each); past this the memo starts over.
_PARTS_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One task to publish by name (the task may live in a process that is not this one).

    ``queue`` None: the app's router decides. ``headers`` are added to Celery's own (the cron
    ``cron_*`` headers); ``expires`` is also the broker-side expiration, as ``send_task`` sets.
    ``options`` are further ``apply_async`` options (a beat_schedule entry's ``routing_key``,
    ``exchange``, ``priority``, ...): given to the router as ``apply_async`` gives them, and
    sent through Celery's public path.

    ``as_apply_async``: send it as ``app.tasks[name].apply_async(args, kwargs, **options)``
    does (``app.send_task`` when this process does not register the task): the task's own
    execution options apply under the message's, and ``time_limit``, ``soft_time_limit`` and
    ``expires`` None mean "not given" (the task's apply), ``expires`` may also be seconds from
    the send. Otherwise the message is exactly its fields (``ignore_result`` included).
    """

    name: str
    queue: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] | list[Any] = ()
    time_limit: float | None = None
    soft_time_limit: float | None = None
    expires: datetime | float | None = None
    task_id: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    ignore_result: bool | None = None
    as_apply_async: bool = False


class Publisher(Protocol):
    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        """Publish all messages; return their task ids, in order."""
        ...


def _origin() -> str:
    return f"gen{os.getpid()}@{socket.gethostname()}"


# kombu's encoder (datetimes, UUIDs, Decimals, bytes as kombu encodes them); the body with
# json.dumps' default separators, byte for byte what kombu's "json" serializer writes.
_dumps = JSONEncoder(separators=(",", ":")).encode
_body_dumps = JSONEncoder().encode
_str = json.encoder.encode_basestring_ascii  # what _dumps does to a str, without the dispatch
_EMBED_JSON = _body_dumps(_EMBED)
_EMPTY_BODY64 = base64.b64encode(f"[[], {{}}, {_EMBED_JSON}]".encode()).decode("ascii")
_EMPTY_ARGSREPR, _EMPTY_KWARGSREPR = _str(repr(())), _str(repr({}))
_REPR_MAXLEVELS = 3  # Celery's task_repr_maxlevels default (fast_path_supported requires it)
_SCALARS = (bool, int, float, type(None))
#: Strings whose repr is Celery's saferepr: printable ASCII without quotes or backslashes.
_PLAIN_TEXT = frozenset(chr(c) for c in range(32, 127)) - frozenset("'\\\"")
_STR = frozenset((str,))
_FLAT = frozenset((str, *_SCALARS))  # the types a flat argument list or kwargs dict holds


def _plain(value: Any) -> bool:
    if type(value) in _SCALARS:
        return True
    return type(value) is str and len(value) < 256 and _PLAIN_TEXT.issuperset(value)


def argrepr(value: Any) -> str:
    """Celery's ``argsrepr``/``kwargsrepr`` of ``value`` (``saferepr``, 1024 characters, three
    levels); ``repr`` where they are the same (flat, short, plain text), which is much faster."""
    kind = type(value)
    if kind is dict:
        flat = _STR.issuperset(map(type, value)) and _FLAT.issuperset(map(type, value.values()))
    else:
        flat = (kind is list or kind is tuple) and _FLAT.issuperset(map(type, value))
    if not flat:
        return saferepr(value, _REPR_MAX, maxlevels=_REPR_MAXLEVELS)
    shown = repr(value)
    if len(shown) < 256:
        # Checked on the repr at once (a message's kwargs are short): it holds no string over
        # 255 characters, and a string outside _PLAIN_TEXT shows in it as a backslash escape,
        # a non-ASCII character or a double quote (repr quotes a string holding ' with ").
        if shown.isascii() and "\\" not in shown and '"' not in shown:
            return shown
        return saferepr(value, _REPR_MAX, maxlevels=_REPR_MAXLEVELS)
    plain = (
        all(_plain(k) and _plain(v) for k, v in value.items())
        if kind is dict
        else all(_plain(v) for v in value)
    )
    if plain and len(shown) <= _REPR_MAX:
        return shown
    return saferepr(value, _REPR_MAX, maxlevels=_REPR_MAXLEVELS)


def _num(value: float | None) -> str:
    if value is None:
        return "null"
    if type(value) in (float, int) and value - value == 0:  # finite: repr is its JSON
        return repr(value)
    return _dumps(value)


_IGNORE_RESULT = {None: "null", True: "true", False: "false"}


def expiration_ms(expires: datetime, now: datetime) -> str:
    """The AMQP ``expiration`` property ``send_task`` derives from ``expires`` (ms, >= 0)."""
    return str(int(max(0.0, (expires - now).total_seconds()) * 1000))


def encode_envelope(
    message: TaskMessage,
    queue: str,
    task_id: str,
    delivery_tag: str,
    *,
    origin: str,
    reply_to: str = "",
    expiration: str | None = None,
    task_defaults: tuple[Any, Any, Any] | None = None,
) -> str:
    """The kombu Redis envelope of a protocol-2 Celery task message, as a JSON string.

    Field for field what ``send_task`` + kombu's Redis transport write for ``queue`` (JSON body,
    base64 body encoding, anonymous exchange, routing key = queue); assembled from pre-escaped
    pieces because this runs once per message. ``origin`` is already JSON-encoded;
    ``expiration`` is :func:`expiration_ms` of ``message.expires``. ``task_defaults``: the
    task's own ``(time_limit, soft_time_limit, ignore_result)`` of an ``as_apply_async``
    message, under its own limits (its ``ignore_result`` is then the task's).
    """
    parts = _envelope_parts(message, queue, origin, _str(reply_to), task_defaults)
    expires = cast("datetime | None", message.expires)  # seconds go the kombu path (BatchPublisher)
    return _join_envelope(
        parts,
        task_id,
        delivery_tag,
        _str(expires.isoformat()) if expires else "null",
        _expiration_field(expiration),
        _headers_json(message.headers),
    )


#: The parts of an envelope that are the same for every message of one task to one queue
#: (body, name, limits, reprs, origin, reply_to, queue), between the per-message ones.
_Parts = tuple[str, str, str, str, str]


def _envelope_parts(
    message: TaskMessage,
    queue: str,
    origin: str,
    reply_to_json: str,
    task_defaults: tuple[Any, Any, Any] | None,
) -> _Parts:
    """:func:`encode_envelope`'s fixed parts of ``message`` (see :data:`_Parts`)."""
    time_limit, soft_time_limit, ignore_result = _limits(message, task_defaults)
    args, kwargs = message.args, message.kwargs
    if args or kwargs:
        args_json = _body_dumps(list(args)) if args else "[]"
        body = f"[{args_json}, {_body_dumps(kwargs)}, {_EMBED_JSON}]"
        body64 = base64.b64encode(body.encode()).decode("ascii")
        shown = args if isinstance(args, list) else tuple(args)  # send_task's saferepr(args)
        argsrepr = _str(argrepr(shown)) if args else _EMPTY_ARGSREPR
        kwargsrepr = _str(argrepr(kwargs)) if kwargs else _EMPTY_KWARGSREPR
    else:
        body64, argsrepr, kwargsrepr = _EMPTY_BODY64, _EMPTY_ARGSREPR, _EMPTY_KWARGSREPR
    return (
        '{"body":"'
        + body64
        + '","content-encoding":"utf-8","content-type":"application/json","headers":{'
        '"lang":"py","task":' + _str(message.name) + ',"id":"',
        ',"group":null,"group_index":null,"retries":0,"timelimit":['
        + _num(time_limit)
        + ","
        + _num(soft_time_limit)
        + '],"root_id":"',
        '","parent_id":null,"argsrepr":'
        + argsrepr
        + ',"kwargsrepr":'
        + kwargsrepr
        + ',"origin":'
        + origin
        + ',"ignore_result":'
        + _IGNORE_RESULT[ignore_result]
        + ',"replaced_task_nesting":0,"stamped_headers":null,"stamps":{}',
        '","reply_to":' + reply_to_json + ',"delivery_mode":2,',
        '"delivery_info":{"exchange":"","routing_key":'
        + _str(queue)
        + '},"priority":0,"body_encoding":"base64","delivery_tag":"',
    )


def _limits(
    message: TaskMessage, task_defaults: tuple[Any, Any, Any] | None
) -> tuple[Any, Any, Any]:
    """(time_limit, soft_time_limit, ignore_result) the envelope carries: the message's, under
    an ``as_apply_async`` message's task defaults."""
    if task_defaults is None:
        return message.time_limit, message.soft_time_limit, message.ignore_result
    time_limit, soft_time_limit = message.time_limit, message.soft_time_limit
    if time_limit is None:
        time_limit = task_defaults[0]
    if soft_time_limit is None:
        soft_time_limit = task_defaults[1]
    return time_limit, soft_time_limit, task_defaults[2]


def _join_envelope(
    parts: _Parts,
    task_id: str,
    delivery_tag: str,
    expires_json: str,
    expiration_field: str,
    headers_json: str,
) -> str:
    """One envelope: ``parts`` with the fields of one message between them."""
    return "".join(
        (
            parts[0],
            task_id,
            '","shadow":null,"eta":null,"expires":',
            expires_json,
            parts[1],
            task_id,
            parts[2],
            headers_json,
            '},"properties":{"correlation_id":"',
            task_id,
            parts[3],
            expiration_field,
            parts[4],
            delivery_tag,
            '"}}',
        )
    )


def _expiration_field(expiration: str | None) -> str:
    return "" if expiration is None else f'"expiration":"{expiration}",'


def _headers_json(headers: Mapping[str, Any]) -> str:
    """``headers`` as the envelope's headers object carries them after Celery's own (with a
    leading comma), as ``_dumps`` writes them: text and flags written here directly, anything
    else by ``_dumps``."""
    if not headers:
        return ""
    fields = []
    for key, value in headers.items():
        if not isinstance(key, str):
            return "," + _dumps(headers)[1:-1]
        if isinstance(value, str):
            fields.append(f"{_str(key)}:{_str(value)}")
        elif value is True or value is False or value is None:
            fields.append(f"{_str(key)}:{_IGNORE_RESULT[value]}")
        else:
            return "," + _dumps(headers)[1:-1]
    return "," + ",".join(fields)


class UniqueIds:
    """UUID-shaped ids, unique per process: one random base plus a counter.

    ``uuid4()`` per message costs more than the rest of the envelope; task ids and delivery
    tags only need to be unique, and these are (the first 80 bits of a random UUID, then a
    48-bit counter).
    """

    def __init__(self) -> None:
        base = f"{uuid.uuid4().int & ~((1 << 48) - 1):032x}"
        # The counter's 48 bits are the last group's 12 hex digits: the rest is fixed.
        self._prefix = f"{base[:8]}-{base[8:12]}-{base[12:16]}-{base[16:20]}-"
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter) & ((1 << 48) - 1):012x}"


class _Expirations:
    """Per distinct ``expires`` of one publish call (cron windows share one): its JSON and the
    ``expiration`` field :func:`expiration_ms` gives it."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)
        self._seen: dict[datetime, tuple[str, str]] = {}

    def __call__(self, expires: datetime | None) -> tuple[str, str]:
        if expires is None:
            return "null", ""
        found = self._seen.get(expires)
        if found is None:
            found = self._seen[expires] = (
                _str(expires.isoformat()),
                _expiration_field(expiration_ms(expires, self.now)),
            )
        return found


class RedisBatchPublisher:
    """The fast path: LPUSH :func:`encode_envelope` envelopes onto the queue lists, one pipeline
    per call.

    A list key is the queue name (priority 0 on kombu's Redis transport): exactly where
    ``send_task(..., queue=q)`` puts a message, and where a worker consuming ``q`` BRPOPs.
    :meth:`publish` needs every message to name its queue; :class:`BatchPublisher` routes.
    """

    def __init__(
        self,
        broker_url: str,
        *,
        chunk: int = 5000,
        reply_to: str = "",
        client: redis.Redis | None = None,
        **client_options: Any,
    ) -> None:
        # ``client``: an already connected one (the Sentinel-managed master of the broker).
        self.client = client or redis.Redis.from_url(broker_url, **client_options)
        self.origin = _dumps(_origin())
        self.reply_to = reply_to
        self.reply_to_json = _str(reply_to)
        self.chunk = chunk
        self.ids = UniqueIds()
        # (name, queue, limits, ignore_result, task defaults) -> the fixed parts of its envelope
        self._parts: dict[tuple[Any, ...], _Parts] = {}

    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        for message in messages:
            if not message.queue:
                raise ValueError(f"task message {message.name!r}: queue is required here")
        # every queue was checked just above
        return self.push([(message, cast(str, message.queue), None) for message in messages])

    def push(
        self, items: Iterable[tuple[TaskMessage, str, tuple[Any, Any, Any] | None]]
    ) -> list[str]:
        """Publish each message onto its list ``queue`` (with the task's defaults of an
        ``as_apply_async`` message, see :func:`encode_envelope`); return the task ids, in
        order."""
        ids: list[str] = []
        by_queue: dict[str, list[str]] = {}
        expiration = _Expirations()
        parts_of = self._parts_of
        new_id = self.ids
        pipe = self.client.pipeline(transaction=False)
        pending = 0
        for message, queue, defaults in items:
            task_id = message.task_id or new_id()
            ids.append(task_id)
            parts = parts_of(message, queue, defaults)
            expires_json, expiration_field = expiration(cast("datetime | None", message.expires))
            envelope = _join_envelope(
                parts,
                task_id,
                new_id(),
                expires_json,
                expiration_field,
                _headers_json(message.headers),
            )
            queued = by_queue.get(queue)
            if queued is None:
                by_queue[queue] = [envelope]
            else:
                queued.append(envelope)
            pending += 1
            if pending >= self.chunk:
                self._flush(pipe, by_queue)
                by_queue, pending = {}, 0
        if pending:
            self._flush(pipe, by_queue)
        return ids

    def _parts_of(
        self, message: TaskMessage, queue: str, defaults: tuple[Any, Any, Any] | None
    ) -> _Parts:
        """The fixed parts of ``message``'s envelope; those of a message without arguments
        (every cron window of a task) depend on the task, queue and limits alone: kept."""
        if message.args or message.kwargs:
            return _envelope_parts(message, queue, self.origin, self.reply_to_json, defaults)
        time_limit, soft_time_limit, ignore_result = _limits(message, defaults)
        # 300 and 300.0 are one key but not one JSON: the types are part of it
        memo = (
            message.name,
            queue,
            type(time_limit),
            time_limit,
            type(soft_time_limit),
            soft_time_limit,
            ignore_result,
        )
        parts = self._parts.get(memo)
        if parts is None:
            if len(self._parts) >= _PARTS_KEPT:
                self._parts.clear()
            parts = self._parts[memo] = _envelope_parts(
                message, queue, self.origin, self.reply_to_json, defaults
            )
        return parts

    @staticmethod
    def _flush(pipe: Any, by_queue: dict[str, list[str]]) -> None:
        for queue, payloads in by_queue.items():
            pipe.lpush(queue, *payloads)
        pipe.execute()

    def close(self) -> None:
        self.client.close()


class KombuBatchPublisher:
    """Celery's public path: ``create_task_message`` + ``send_task_message`` inside kombu's
    ``Producer.batch``, with the options ``send_task`` would use (any broker, any route)."""

    def __init__(self, app: Celery, *, max_size: int = 1000) -> None:
        self.app = app
        self.max_size = max_size

    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        # Any: celery-types wants a task class and a tuple where Celery passes the task, a list
        router: Any = self.app.amqp.router
        routes = [
            router.route(
                {"queue": m.queue} if m.queue else {}, m.name, m.args, m.kwargs, self._task(m)
            )
            for m in messages
        ]
        return self.send(list(zip(messages, routes, strict=True)))

    def _task(self, message: TaskMessage) -> Any:
        return self.app.tasks.get(message.name)

    def send(self, items: Sequence[tuple[TaskMessage, Mapping[str, Any] | None]]) -> list[str]:
        """Publish each message with its resolved route (None: ``as_apply_async``, routed by
        Celery); return the task ids, in order."""
        amqp = self.app.amqp
        reply_to = self.app.thread_oid
        ids = []
        now = datetime.now(UTC)
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=self.max_size):
            for message, route in items:
                if route is None:
                    ids.append(self._apply_async(message, producer))
                    continue
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
                    reply_to=reply_to,
                    ignore_result=message.ignore_result,
                )
                options = dict(route)
                if isinstance(message.expires, datetime):
                    options["expiration"] = max(0.0, (message.expires - now).total_seconds())
                amqp.send_task_message(
                    producer,
                    message.name,
                    task,
                    retry=False,  # the caller records a failed publish; a retry could block
                    headers=dict(message.headers) or None,
                    **options,
                )
        return ids

    def _apply_async(self, message: TaskMessage, producer: Any) -> str:
        """Send as Celery's beat sends an entry: ``apply_async`` of the task this process
        registers (its steps, without the argument check), else ``send_task`` by name; the
        message's given fields are options."""
        options = dict(message.options)
        if message.queue and "queue" not in options:
            options["queue"] = message.queue
        for name in ("time_limit", "soft_time_limit", "expires", "task_id"):
            value = getattr(message, name)
            if value is not None:
                options[name] = value
        if message.headers:
            options["headers"] = dict(message.headers)
        options.setdefault("retry", False)  # the caller records a failed publish
        args, kwargs = list(message.args), dict(message.kwargs)
        task = self._task(message)
        if task is None:
            return self.app.send_task(message.name, args, kwargs, producer=producer, **options).id
        if getattr(task, "_dump_pydantic_arguments", None) is not None:
            # its arguments are converted by apply_async itself
            return task.apply_async(args, kwargs, producer=producer, **options).id
        # Task.apply_async's own steps, but for its refusals (arguments that do not fit the
        # task, a soft limit over the hard one): such a window is sent and fails on the worker
        # (recorded there), where raising here would fail every window of this batch.
        options = dict(extract_exec_options(task), **options)
        options.setdefault("ignore_result", task.ignore_result)
        shadow = options.pop("shadow", None) or task.shadow_name(args, kwargs, options)
        return self.app.send_task(
            task.name,
            args,
            kwargs,
            producer=producer,
            result_cls=task.AsyncResult,
            shadow=shadow,
            task_type=task,
            **options,
        ).id

    def close(self) -> None:
        pass


def fast_path_supported(app: Celery) -> bool:
    """Whether :class:`RedisBatchPublisher` writes where this app's workers read, in the format
    they accept."""
    url = app.conf.broker_url or ""
    options = app.conf.broker_transport_options or {}
    return (
        url.split("://", 1)[0] in ("redis", "rediss", "sentinel")
        and not options.get("global_keyprefix")
        and not options.get("priority_steps")
        and options.get("queue_order_strategy") != "priority"
        and app.conf.task_serializer == "json"
        and not app.conf.task_compression
        and app.conf.task_protocol == 2
        and app.conf.task_repr_maxlevels == _REPR_MAXLEVELS
    )


#: What the fast path knows of a task's own execution options: (time_limit, soft_time_limit,
#: ignore_result); None when its envelope cannot reproduce them (a priority, a routing option,
#: another serializer, a custom shadow name, pydantic arguments, ...).
_TaskDefaults = tuple[Any, Any, Any] | None
_Defaults = tuple[Any, Any, Any]


def _task_defaults(app: Celery, name: str) -> _TaskDefaults:
    """What ``apply_async`` of task ``name`` adds to a send, if the fast path can write it."""
    task = app.tasks.get(name)
    if task is None:
        return (None, None, None)  # send_task of a name this process does not register
    options = extract_exec_options(task)
    time_limit, soft_time_limit = options.pop("time_limit"), options.pop("soft_time_limit")
    others = {k: v for k, v in options.items() if v is not None}
    if others.get("serializer") == app.conf.task_serializer:
        del others["serializer"]
    if (
        others
        or type(task).shadow_name is not Task.shadow_name
        or task.__v2_compat__
        or getattr(task, "_dump_pydantic_arguments", None) is not None
        or task.ignore_result not in (None, True, False)
        or (soft_time_limit and time_limit and soft_time_limit > time_limit)  # apply_async raises
    ):
        return None
    return (time_limit, soft_time_limit, task.ignore_result)


def _publish_signals_connected() -> bool:
    """Whether anything listens to Celery's publish signals (they may change the message, e.g.
    a tracing header): then a message sent as ``apply_async`` takes Celery's path, which sends
    them."""
    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)


class BatchPublisher:
    """What :func:`make_publisher` returns: each message by the fast path when its route allows,
    the others through Celery's public path, in one call."""

    def __init__(self, app: Celery, fast: RedisBatchPublisher | None) -> None:
        self.app = app
        self.fast = fast
        self.kombu = KombuBatchPublisher(app)
        # (task name, queue) -> (list key for the fast path or None, the route)
        self._routes: dict[tuple[str, str | None], tuple[str | None, Mapping[str, Any]]] = {}
        self._defaults: dict[str, _TaskDefaults] = {}

    @property
    def client(self) -> redis.Redis:
        """The fast path's broker client (a Redis broker only)."""
        if self.fast is None:
            raise AttributeError("this publisher has no Redis fast path")
        return self.fast.client

    def destination(self, name: str, queue: str | None) -> tuple[str | None, Mapping[str, Any]]:
        """The route of ``name`` (to ``queue`` if given) and, if the fast path can take it, the
        list key it writes (the queue's name: a direct queue on the anonymous exchange)."""
        found = self._routes.get((name, queue))
        if found is None:
            router: Any = self.app.amqp.router  # as in KombuBatchPublisher.publish
            route = router.route(
                {"queue": queue} if queue else {}, name, (), {}, self.app.tasks.get(name)
            )
            target = route.get("queue")
            key = None
            # Any other route option (exchange, priority, serializer, ...) takes Celery's path.
            plain = set(route) <= _PLAIN_ROUTE
            if self.fast is not None and target is not None and plain:
                exchange = target.exchange
                mode = exchange.delivery_mode or self.app.conf.task_default_delivery_mode
                if (
                    exchange.type == "direct"
                    and not target.expires
                    and mode in (_PERSISTENT, "persistent")
                ):
                    key = target.name
            found = self._routes[(name, queue)] = (key, route)
        return found

    def prepare(self, names: Iterable[str]) -> None:
        """Resolve the routes of these task names now, so the first batch is as fast as the
        rest."""
        for name in names:
            self.destination(name, None)
            self.defaults(name)

    def defaults(self, name: str) -> _TaskDefaults:
        """:func:`_task_defaults` of ``name``, resolved once."""
        try:
            return self._defaults[name]
        except KeyError:
            found = self._defaults[name] = _task_defaults(self.app, name)
            return found

    def _apply_async_target(self, name: str, queue: str | None) -> tuple[str, _Defaults] | None:
        """The list key and the task's defaults of an ``as_apply_async`` message to ``queue``,
        when the fast path writes exactly what ``apply_async`` would; else None."""
        key = self.destination(name, queue)[0]
        defaults = self.defaults(name)
        if key is None or defaults is None:
            return None
        return key, defaults

    def publish(self, messages: Sequence[TaskMessage]) -> list[str]:
        fast: list[tuple[TaskMessage, str, _Defaults | None]] = []
        slow: list[tuple[TaskMessage, Mapping[str, Any] | None]] = []
        order: list[bool] = []  # per message: fast path?
        # Whether anything listens to the publish signals (then apply_async's messages take
        # Celery's path): read once per call, not per message.
        signals: bool | None = None
        for message in messages:
            if message.as_apply_async:
                target = None
                if (
                    self.fast is not None
                    and not message.options
                    and isinstance(message.expires, datetime | None)
                ):
                    target = self._apply_async_target(message.name, message.queue)
                    if target is not None:
                        if signals is None:
                            signals = _publish_signals_connected()
                        if signals:
                            target = None
                order.append(target is not None)
                if target is None:
                    slow.append((message, None))
                else:
                    fast.append((message, target[0], target[1]))
                continue
            if message.options:
                slow.append((message, self._route_with_options(message)))
                order.append(False)
                continue
            key, route = self.destination(message.name, message.queue)
            order.append(key is not None)
            if key is not None:
                fast.append((message, key, None))
            else:
                slow.append((message, route))
        fast_ids = iter(self.fast.push(fast) if fast and self.fast else [])
        slow_ids = iter(self.kombu.send(slow) if slow else [])
        return [next(fast_ids) if is_fast else next(slow_ids) for is_fast in order]

    def _route_with_options(self, message: TaskMessage) -> Mapping[str, Any]:
        """The route ``apply_async(**options)`` would take: the options over the router's."""
        options = dict(message.options)
        if message.queue:
            options["queue"] = message.queue
        router: Any = self.app.amqp.router  # as in KombuBatchPublisher.publish
        return router.route(
            options, message.name, message.args, message.kwargs, self.app.tasks.get(message.name)
        )

    def close(self) -> None:
        if self.fast is not None:
            self.fast.close()


def make_publisher(app: Celery) -> BatchPublisher:
    """The publisher for this app's broker (the fast path wherever it is correct)."""
    fast = None
    if fast_path_supported(app):
        from celery_app.factory import settings_of
        from celery_app.redis.sentinel import is_sentinel_url
        from celery_app.redis.tls import redis_tls_kwargs

        url = app.conf.broker_url
        settings = settings_of(app)
        if is_sentinel_url(url):
            # The master the broker's Sentinels name, found again after a failover.
            from celery_app.redis.client import sentinel_master

            client = sentinel_master(url, settings)
            fast = RedisBatchPublisher(url, reply_to=app.thread_oid, client=client)
        else:
            options = redis_tls_kwargs(url, settings)
            fast = RedisBatchPublisher(url, reply_to=app.thread_oid, **options)
    return BatchPublisher(app, fast)


def publish_all(app: Celery, messages: Iterable[TaskMessage]) -> list[str]:
    """One-shot convenience: publish with a fresh publisher."""
    publisher = make_publisher(app)
    try:
        return publisher.publish(list(messages))
    finally:
        publisher.close()
