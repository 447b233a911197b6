"""The one publisher: its messages are Celery's own, field by field, and real workers run them.

Both paths of :func:`celery_app.publish.make_publisher` are held against what ``send_task``
puts on the same queue: the Redis fast path (envelopes written by ``encode_envelope``) and
Celery's public path (``create_task_message`` + ``send_task_message`` in ``Producer.batch``).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from support.cron import T0, store_of
from support.polling import wait_for

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import from_unix, read_job
from celery_app.cron_tasks.cron_state import FireRequest, window_deadline
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks
from celery_app.cron_tasks.sender import CronHeader, CronPublisher, cron_message
from celery_app.publish import BatchPublisher, TaskMessage, UniqueIds, make_publisher
from celery_app.redis.schema import CronOutcome, CronStateField, check_queue

#: Fields that are fresh per message (ids); every other field must be equal.
ID_HEADERS = {"id", "root_id"}
ID_PROPERTIES = {"correlation_id", "delivery_tag"}
CRON_QUEUE = "cron.reports"


def _noop(tenant: str | None = None) -> None: ...


def _only(broker, queue: str) -> dict:
    (raw,) = broker.lrange(queue, 0, -1)
    broker.delete(queue)
    return json.loads(raw)


def _fields(envelope: dict) -> dict:
    """An envelope with its body decoded and its ids and expiration set apart."""
    headers = dict(envelope["headers"])
    properties = dict(envelope["properties"])
    ids = {k: headers.pop(k) for k in ID_HEADERS} | {k: properties.pop(k) for k in ID_PROPERTIES}
    assert ids["id"] == ids["root_id"] == ids["correlation_id"], ids
    expiration = properties.pop("expiration", None)
    rest = {k: v for k, v in envelope.items() if k not in ("headers", "properties", "body")}
    body = json.loads(base64.b64decode(envelope["body"]))
    return {
        "body": body,
        "headers": headers,
        "properties": properties,
        "envelope": rest,
        "expiration": None if expiration is None else int(expiration),
    }


def _assert_same(ours: dict, celerys: dict) -> None:
    a, b = _fields(ours), _fields(celerys)
    for part in ("body", "headers", "properties", "envelope"):
        assert a[part] == b[part], part
    if b["expiration"] is None:
        assert a["expiration"] is None
    else:  # milliseconds until expires, taken a moment apart
        assert a["expiration"] == pytest.approx(b["expiration"], abs=5000)


def _publishers(app):
    fast = make_publisher(app)
    assert fast.fast is not None, "the test broker is Redis: the fast path must be on"
    return {"redis-fast-path": fast, "celery-public-path": BatchPublisher(app, None)}


@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_a_check_message_is_the_one_send_task_publishes(celery_app, broker, path):
    publisher = _publishers(celery_app)[path]
    queue = check_queue("eu", "fast")
    kwargs = {"job": "chk-1@eu", "lease_token": "17.3", "scheduled_at": 1780000000.25}
    message = TaskMessage(
        name="checkbeat.run_check", queue=queue, kwargs=kwargs, time_limit=20.5, soft_time_limit=15
    )
    (task_id,) = publisher.publish([message])
    ours = _only(broker, queue)
    celery_app.send_task(
        "checkbeat.run_check", kwargs=kwargs, queue=queue, time_limit=20.5, soft_time_limit=15
    )
    _assert_same(ours, _only(broker, queue))
    assert ours["headers"]["id"] == task_id


def test_task_ids_and_delivery_tags_are_distinct_uuid_strings():
    """What a publisher's UniqueIds gives: UUIDs as ``str(uuid4())`` writes them, none twice,
    in this publisher or another's."""
    first, second = UniqueIds(), UniqueIds()
    ids = [first() for _ in range(5000)] + [second() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert all(str(uuid.UUID(i)) == i for i in ids)


#: Arguments whose argsrepr/kwargsrepr the fast path must write as Celery's saferepr does:
#: plain ones (its shortcut) and every kind of string or value the shortcut must refuse.
TRICKY_ARGUMENTS = [
    ((), {"job_id": "chk-1@eu", "lease_token": "17.3", "scheduled_at": 1.5, "timeout_s": 10}),
    (("a", 1, 2.5, None, True), {}),
    ((), {"quote": "it's"}),
    ((), {"double": 'say "hi"'}),
    ((), {"both": 'it\'s "x"'}),
    ((), {"backslash": "a\\b"}),
    ((), {"newline": "a\nb", "tab": "\t"}),
    ((), {"unicode": "caf\u00e9", "emoji": "\U0001f600"}),
    ((), {"it's": 1}),
    ((), {"long": "x" * 300}),
    ((), {"edge": "y" * 240, "n": 1}),
    (("z" * 2000,), {}),
    ((), {"nested": {"a": [1, 2, {"b": "c"}]}}),
    ((), {"inf": float("inf"), "nan": float("nan"), "big": 10**30}),
]


@pytest.mark.parametrize(("args", "kwargs"), TRICKY_ARGUMENTS)
def test_the_fast_path_shows_arguments_as_send_task_does(celery_app, broker, args, kwargs):
    publisher = _publishers(celery_app)["redis-fast-path"]
    queue = check_queue("eu", "fast")
    message = TaskMessage(name="checkbeat.run_check", queue=queue, args=args, kwargs=kwargs)
    publisher.publish([message])
    ours = _only(broker, queue)
    celery_app.send_task("checkbeat.run_check", args=args, kwargs=kwargs, queue=queue)
    celerys = _only(broker, queue)
    for field in ("argsrepr", "kwargsrepr"):
        assert ours["headers"][field] == celerys["headers"][field], field


@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_a_cron_message_is_the_one_apply_async_publishes_on_the_tasks_route(
    celery_app, broker, path
):
    cron("* * * * *", app=celery_app, id="reports", name="pub.reports", queue=CRON_QUEUE)(_noop)
    cron("* * * * *", app=celery_app, id="tenanted", name="pub.tenanted", per_tenant=True)(_noop)
    tasks = cron_tasks(celery_app)
    grace = timedelta(seconds=60)
    sender = CronPublisher(celery_app, grace, _publishers(celery_app)[path])
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    requests = [
        FireRequest(tasks["reports"], GLOBAL_TENANT, window),
        FireRequest(tasks["tenanted"], "acme", window),
    ]
    ids = sender.publish(requests, manual=True)
    assert len(set(ids)) == 2
    # the declared queue is the router's answer; the other task goes to the default queue
    for req, queue in zip(requests, (CRON_QUEUE, "celery"), strict=True):
        ours = _only(broker, queue)
        assert ours["headers"][CronHeader.WINDOW] == req.window_id
        assert ours["headers"][CronHeader.MANUAL] is True
        message = cron_message(req, grace, manual=True)
        assert message.expires == window_deadline(window, grace)
        # sent as apply_async sends it (as Celery's beat does): the task's ignore_result too
        celery_app.tasks[req.task.name].apply_async(
            kwargs=message.kwargs,
            expires=message.expires,
            time_limit=req.task.hard_time_limit,
            soft_time_limit=req.task.soft_time_limit,
            headers=dict(message.headers),
        )
        _assert_same(ours, _only(broker, queue))


def test_a_route_the_fast_path_cannot_take_goes_through_celery(celery_app, broker):
    celery_app.conf.task_routes = [{"pub.prio": {"queue": "celery", "priority": 5}}]
    publisher = make_publisher(celery_app)
    assert publisher.destination("pub.prio", None)[0] is None
    assert publisher.destination("pub.plain", None)[0] == "celery"
    ids = publisher.publish([TaskMessage("pub.plain"), TaskMessage("pub.prio")])
    # kombu keeps priority 5 apart (its priority steps); both are on their way to "celery"
    found = {
        json.loads(raw)["headers"]["id"]
        for key in broker.keys("celery*")
        if broker.type(key) == "list"
        for raw in broker.lrange(key, 0, -1)
    }
    assert found == set(ids)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_a_real_worker_runs_a_cron_window_and_a_check_from_one_publish(
    request, celery_app, settings, r, keys, store, broker, path
):
    ran: list[str] = []

    @cron("* * * * *", app=celery_app, id="nightly", name="pub.nightly")
    def nightly() -> None:
        ran.append("nightly")

    now = time.time()
    store.create(
        uid="c1",
        tenant="acme",
        kind="testprobe",
        target="x",
        period=60,
        regions=["eu"],
        now=from_unix(now - 70),
    )
    cron_store = store_of(celery_app)
    (task,) = cron_tasks(celery_app).values()
    window = FireRequest(task, GLOBAL_TENANT, T0)
    claim = cron_store.claim([window], now=T0, owner="test")
    publisher = _publishers(celery_app)[path]

    class WithTheCronWindow:
        """The dispatcher's batch of check runs, published in one batch behind the window."""

        def __init__(self) -> None:
            self.ids: list[str] = []

        def publish(self, messages: list[TaskMessage]) -> list[str]:
            self.ids = publisher.publish([cron_message(window, settings.cron_grace), *messages])
            return self.ids[1:]

    both = WithTheCronWindow()
    home = keys.of_check("c1").partition
    dispatcher = Dispatcher(celery_app, client=r, publisher=both, partition=home)
    # The in-process worker (celery.contrib.pytest's celery_worker) starts once pub.nightly is
    # registered: a worker builds its task table when it starts.
    request.getfixturevalue("celery_worker")
    wait_for(lambda: r.scard(keys.region_workers("eu")) == 1, 20, what="registration")
    assert len(dispatcher.tick(now).claims) == 1  # beat's tick publishes through ``both``
    ids = both.ids
    cron_store.confirm_sent(claim)
    assert len(set(ids)) == 2
    state_key = keys.cron_state("nightly", GLOBAL_TENANT)
    wait_for(
        lambda: (
            r.hget(state_key, CronStateField.OUTCOME) == CronOutcome.SUCCESS
            and read_job(r, keys, "c1@eu").runs == 1
        ),
        timeout=30,
        what="the cron run recorded and the check run completed",
    )
    assert ran == ["nightly"]
    state = r.hgetall(state_key)
    assert state[CronStateField.CELERY_ID] == ids[0]
    assert state[CronStateField.LAST_RUN_WINDOW] == window.window_id
    assert read_job(r, keys, "c1@eu").lease_token is None
    assert json.loads(r.hget(keys.last_result("c1"), "eu"))["status"] == "up"


def test_a_declared_queue_holds_in_an_app_without_checkbeats_router(broker_url, r):
    """A user app that only set ``beat_scheduler`` has no cron router in ``task_routes``; the
    declared queue is on the message itself, so the window still lands there."""
    from celery import Celery

    plain = Celery("plain", broker=broker_url, set_as_current=False)
    cron("0 3 * * *", app=plain, id="q-plain", name="plain.q", queue=CRON_QUEUE)(_noop)
    cron("0 3 * * *", app=plain, id="d-plain", name="plain.d")(_noop)
    tasks = cron_tasks(plain)
    broker = redis.Redis.from_url(broker_url)
    broker.delete(CRON_QUEUE, "celery")
    sender = CronPublisher(plain, timedelta(seconds=60))
    try:
        sender.publish([FireRequest(tasks[t], GLOBAL_TENANT, T0) for t in ("q-plain", "d-plain")])
    finally:
        sender.close()
    assert _only(broker, CRON_QUEUE)["headers"]["cron_task"] == "q-plain"
    assert _only(broker, "celery")["headers"]["cron_task"] == "d-plain"


def _raw_timelimit(raw: str) -> str:
    """The ``timelimit`` header as written (300 and 300.0 are one number but not one JSON)."""
    found = re.search(r'"timelimit":\s*\[([^\]]*)\]', raw)
    assert found is not None, raw
    return found.group(1).replace(" ", "")


def test_windows_of_one_task_keep_their_own_limits_and_headers_on_the_fast_path(celery_app, broker):
    """The fast path keeps an envelope's fixed parts per task and queue: a later message of
    the task with other limits (of another type, too) or other headers is still written as
    ``send_task`` writes it."""
    publisher = _publishers(celery_app)["redis-fast-path"]
    queue = "pub.same"
    variants: list[dict] = [
        {"time_limit": 300, "soft_time_limit": 300.0, "headers": {"w": "a", "flag": True}},
        {"time_limit": 300.0, "soft_time_limit": 300, "headers": {"w": "b", "n": 7}},
        {"time_limit": None, "soft_time_limit": None, "headers": {"x": {"y": [1, "é"]}}},
        {"time_limit": 300, "soft_time_limit": 300.0, "headers": {"w": 'q"\\', "none": None}},
    ]
    for _ in range(2):  # the second round meets the parts the first one kept
        for variant in variants:
            publisher.publish([TaskMessage(name="pub.same", queue=queue, **variant)])
            (ours,) = broker.lrange(queue, 0, -1)
            broker.delete(queue)
            celery_app.send_task("pub.same", queue=queue, **variant)
            (celerys,) = broker.lrange(queue, 0, -1)
            broker.delete(queue)
            assert _raw_timelimit(ours) == _raw_timelimit(celerys)
            _assert_same(json.loads(ours), json.loads(celerys))
