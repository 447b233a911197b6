"""Every message CronScheduler sends is the one Celery's beat sends, header by header.

A user's own app (``Celery("proj")``, ``task_time_limit=1800``, annotations, queues with an
exchange) holds ``beat_schedule`` entries of each kind; each entry is sent once by Celery's
``Scheduler.apply_async`` and once by checkbeat's cron publisher (both publisher paths), and the
two raw envelopes are read off the real broker's lists and compared: body, properties, the
envelope and every header. ``@cron`` and runtime schedules are held against the beat entry that
says what they declare (their time limits, window deadline, queue). What may differ: the per-send
ids, ``expires``/``expiration`` (taken a moment apart, compared by shape), and exactly the
headers in :data:`EXTRA_HEADERS`, which docs/migrating.md ("What is sent") documents.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab, schedule, solar
from kombu import Exchange, Queue
from support.beat_entries import ENTRY_OPTIONS

from celery_app.cron_tasks.cron_state import FireRequest, task_deadline
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron
from celery_app.cron_tasks.runtime import add_schedule, runtime_store
from celery_app.cron_tasks.sender import CronHeader, CronPublisher
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.publish import BatchPublisher, make_publisher

#: The headers a scheduled checkbeat message carries beyond Celery's beat's, and nothing else.
EXTRA_HEADERS = {CronHeader.TASK, CronHeader.WINDOW, CronHeader.TENANT}
#: A run-now (``schedule run``) is not sent by beat: Celery's ``celery_beat_task`` is left out,
#: ``cron_manual`` says what it is.
MANUAL_HEADERS = EXTRA_HEADERS | {CronHeader.MANUAL}
GRACE = timedelta(seconds=60)


class EveryOtherMinute(schedule):
    """A project's own schedule class, as real ones are written: ``is_due`` of its own."""

    def __init__(self) -> None:
        super().__init__(timedelta(minutes=2))

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        return super().is_due(last_run_at)


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?[+-]\d\d:\d\d$")


def _task_body(x=0, y=0, tenant=None):
    return x + y


@pytest.fixture
def proj(r, broker, broker_url, monkeypatch):
    """A user's project app: its own settings, tasks, queues and beat_schedule."""
    app = Celery("proj", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_time_limit=1800,
        task_soft_time_limit=1500,
        task_queues=[
            Queue("q1", Exchange("ex", type="direct"), routing_key="rk"),
            Queue("tq"),
            Queue("cron.q"),
            Queue("celery"),
        ],
        task_routes={"proj.routed": {"queue": "tq"}},
        task_annotations={"proj.annotated": {"time_limit": 60, "soft_time_limit": 50}},
        result_expires=None,
        timezone="Europe/Berlin",
        beat_scheduler="beat:CronScheduler",
    )
    app.task(name="proj.plain", shared=False)(_task_body)
    app.task(name="proj.routed", shared=False)(_task_body)
    app.task(name="proj.annotated", shared=False)(_task_body)
    app.task(
        name="proj.own", shared=False, time_limit=120, soft_time_limit=100, ignore_result=True
    )(_task_body)
    cron("* * * * *", app=app, id="cron-plain", name="proj.cron")(_task_body)
    cron("* * * * *", app=app, id="cron-queued", name="proj.cronq", queue="cron.q")(_task_body)
    cron("* * * * *", app=app, id="cron-tenants", name="proj.tenants", per_tenant=True)(_task_body)
    soon = datetime.now(UTC) + timedelta(hours=1)
    app.conf.beat_schedule = {
        "crontab-plain": {"task": "proj.plain", "schedule": crontab()},
        "interval-args": {"task": "proj.plain", "schedule": 20, "args": (1,), "kwargs": {"y": 2}},
        "interval-options": {"task": "proj.plain", "schedule": 20, "options": ENTRY_OPTIONS},
        "routed": {"task": "proj.routed", "schedule": timedelta(seconds=30), "args": [3]},
        "annotated": {"task": "proj.annotated", "schedule": crontab(minute="*/5")},
        "own-limits": {"task": "proj.own", "schedule": crontab()},
        "option-limits": {
            "task": "proj.plain",
            "schedule": crontab(),
            "options": {"time_limit": 99, "soft_time_limit": 88, "expires": soon},
        },
        "unregistered": {"task": "remote.job", "schedule": 20, "kwargs": {"a": "b"}},
        "solar": {"task": "proj.plain", "schedule": solar("sunrise", 48.85, 2.35), "args": [5]},
        "relative": {
            "task": "proj.plain",
            "schedule": timedelta(seconds=30),
            "relative": True,
            "kwargs": {"y": 1},
        },
        "custom": {
            "task": "proj.plain",
            "schedule": EveryOtherMinute(),
            "options": {"queue": "cron.q"},
        },
        "nested-args": {
            "task": "proj.plain",
            "schedule": 20,
            "args": [{"a": [1, {"b": [2, {"c": "it's"}]}]}],
            "kwargs": {"y": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)},
        },
    }
    monkeypatch.setenv("CHECKBEAT_TIMEZONE", "UTC")
    with app.connection_for_write() as conn:
        for queue in app.conf.task_queues:
            queue(conn.default_channel).declare()
    add_schedule(app, "rt-queued", task="proj.plain", every="15s", queue="cron.q")
    add_schedule(
        app, "rt-plain", task="remote.job", cron="*/2 * * * *", args='["x"]', remote_task=True
    )
    yield app
    app.close()


def _publisher(app: Celery, path: str) -> CronPublisher:
    inner = make_publisher(app) if path == "redis-fast-path" else BatchPublisher(app, None)
    if path == "redis-fast-path":
        assert inner.fast is not None
    return CronPublisher(app, GRACE, inner)


#: The entries whose task options the fast path's envelope writes itself (the others, with a
#: priority, an exchange or options of their own, go through Celery's apply_async).
FAST = {
    "crontab-plain",
    "interval-args",
    "routed",
    "annotated",
    "own-limits",
    "unregistered",
    "nested-args",
    "solar",
    "relative",
    "cron-plain",
    "cron-queued",
    "cron-tenants",
    "rt-queued",
    "rt-plain",
}


def _on_fast_path(publisher: CronPublisher, req: FireRequest) -> bool:
    """Whether the publisher writes ``req``'s message itself (not through Celery)."""
    fast = publisher.publisher.fast
    if fast is None:
        publisher.publish([req])
        return False
    pushed = fast.push
    seen: list[int] = []

    def counting(items):
        items = list(items)
        seen.append(len(items))
        return pushed(items)

    fast.push = counting
    try:
        publisher.publish([req])
    finally:
        del fast.push
    return seen == [1]


def _take_one(broker) -> tuple[str, dict]:
    """The one message on the broker's lists (and which list), removed."""
    found = [
        (key, raw)
        for key in broker.keys("*")
        if not key.startswith("_kombu") and broker.type(key) == "list"
        for raw in broker.lrange(key, 0, -1)
    ]
    assert len(found) == 1, found
    key, raw = found[0]
    broker.delete(key)
    return key, json.loads(raw)


def _per_send(envelope: dict) -> tuple[dict, dict]:
    """The envelope without its per-send fields, and those fields."""
    headers = dict(envelope["headers"])
    properties = dict(envelope["properties"])
    sent = {k: headers.pop(k) for k in ("id", "root_id", "expires")}
    sent |= {k: properties.pop(k, None) for k in ("correlation_id", "delivery_tag", "expiration")}
    rest = {k: v for k, v in envelope.items() if k not in ("headers", "properties", "body")}
    body = json.loads(base64.b64decode(envelope["body"]))
    return {"body": body, "headers": headers, "properties": properties, "envelope": rest}, sent


def _expires(value: str | None) -> datetime | None:
    if value is None:
        return None
    assert _ISO.match(value), value
    return datetime.fromisoformat(value)


def _assert_as_beat_sends(ours: dict, beats: dict, extra: set[str]) -> None:
    a, a_sent = _per_send(ours)
    b, b_sent = _per_send(beats)
    for sent in (a_sent, b_sent):
        assert _UUID.match(sent["id"]) and sent["id"] == sent["root_id"] == sent["correlation_id"]
        assert _UUID.match(sent["delivery_tag"])
    added = set(a["headers"]) - set(b["headers"])
    assert added == extra, added
    assert set(b["headers"]) <= set(a["headers"])
    for name in added:
        del a["headers"][name]
    assert a == b
    ours_expires, beats_expires = _expires(a_sent["expires"]), _expires(b_sent["expires"])
    if beats_expires is None:
        assert ours_expires is None and a_sent["expiration"] is None
    else:  # taken a moment apart; the same zone
        assert ours_expires is not None
        assert ours_expires.utcoffset() == beats_expires.utcoffset()
        assert abs(ours_expires - beats_expires) < timedelta(seconds=5)
        assert abs(int(a_sent["expiration"]) - int(b_sent["expiration"])) < 5000


def _entry(app: Celery, name: str, task: str, options: dict, **more) -> ScheduleEntry:
    return ScheduleEntry(name=name, task=task, schedule=crontab(), options=options, app=app, **more)


def _declared_as_beat_entry(app: Celery, req: FireRequest) -> ScheduleEntry:
    """The beat_schedule entry that says what an @cron or runtime task declares: its time
    limits, its window's deadline as ``expires``, its queue, its arguments."""
    task = req.task
    options = {
        "time_limit": task.hard_time_limit,
        "soft_time_limit": task.soft_time_limit,
        "expires": task_deadline(task, req.window, GRACE),
    }
    if task.queue:
        options["queue"] = task.queue
    kwargs = dict(task.kwargs)
    if task.per_tenant:
        kwargs["tenant"] = req.tenant
    return _entry(app, task.id, task.name, options, args=list(task.args), kwargs=kwargs)


@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_every_entry_is_sent_as_celerys_beat_sends_it_plus_three_headers(proj, broker, path):
    tasks = all_tasks(proj, runtime_store(proj))
    celery_beat = Scheduler(proj)
    publisher = _publisher(proj, path)
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    compared = []
    for task_id, task in tasks.items():
        tenant = "acme" if task.per_tenant else GLOBAL_TENANT
        req = FireRequest(task, tenant, task.window_of(window))
        if task_id in proj.conf.beat_schedule:
            reference = celery_beat.schedule[task_id]
        else:
            reference = _declared_as_beat_entry(proj, req)
        celery_beat.apply_async(reference, advance=False)
        beats_queue, beats = _take_one(broker)
        fast = _on_fast_path(publisher, req)
        assert fast == (path == "redis-fast-path" and task_id in FAST), task_id
        ours_queue, ours = _take_one(broker)
        assert ours_queue == beats_queue, task_id
        assert ours["headers"][CronHeader.WINDOW] == req.window_id
        assert ours["headers"][CronHeader.TENANT] == tenant
        assert ours["headers"][CronHeader.TASK] == task_id
        try:
            _assert_as_beat_sends(ours, beats, EXTRA_HEADERS)
        except AssertionError as exc:
            raise AssertionError(f"{task_id}: {exc}\nours:  {ours}\nbeat's: {beats}") from exc
        compared.append(task_id)
    publisher.close()
    assert set(compared) == {
        *proj.conf.beat_schedule,
        "cron-plain",
        "cron-queued",
        "cron-tenants",
        "rt-queued",
        "rt-plain",
    }


def test_the_limits_beat_takes_from_the_settings_and_the_task_are_in_our_headers(proj, broker):
    """The values themselves, so a shared mistake of both sides cannot pass."""
    tasks = all_tasks(proj)
    publisher = _publisher(proj, "redis-fast-path")
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    expected = {
        "crontab-plain": ([1800, 1500], False),
        "annotated": ([60, 50], False),
        "own-limits": ([120, 100], True),
        "option-limits": ([99, 88], False),
        "unregistered": ([None, None], None),
        "cron-plain": ([305.0, 300.0], False),
    }
    for task_id, (limits, ignore_result) in expected.items():
        publisher.publish([FireRequest(tasks[task_id], GLOBAL_TENANT, window)])
        _, ours = _take_one(broker)
        assert ours["headers"]["timelimit"] == limits, task_id
        assert ours["headers"]["ignore_result"] is ignore_result, task_id
        assert ours["headers"]["celery_beat_task"] is True, task_id
    publisher.close()


@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_a_run_now_carries_cron_manual_and_not_celery_beat_task(proj, broker, path):
    tasks = all_tasks(proj)
    celery_beat = Scheduler(proj)
    publisher = _publisher(proj, path)
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    for reference, req in (
        (celery_beat.schedule["crontab-plain"], FireRequest(tasks["crontab-plain"], "-", window)),
        (None, FireRequest(tasks["cron-plain"], GLOBAL_TENANT, window)),
    ):
        celery_beat.apply_async(reference or _declared_as_beat_entry(proj, req), advance=False)
        _, beats = _take_one(broker)
        del beats["headers"]["celery_beat_task"]
        publisher.publish([req], manual=True)
        _, ours = _take_one(broker)
        assert ours["headers"][CronHeader.MANUAL] is True
        _assert_as_beat_sends(ours, beats, MANUAL_HEADERS)
    publisher.close()


@pytest.mark.parametrize("path", ["redis-fast-path", "celery-public-path"])
def test_arguments_that_do_not_fit_the_task_do_not_fail_the_other_windows(proj, broker, path):
    """Celery's beat refuses to send such an entry (apply_async checks the arguments); here the
    windows of one tick are one batch, so it is sent (the worker fails it and records that) and
    the others published with it are sent too."""
    from celery.beat import SchedulingError

    proj.conf.beat_schedule["bad-args"] = {
        "task": "proj.plain",
        "schedule": 20,
        "args": [1, 2, 3, 4],
    }
    with pytest.raises(SchedulingError):
        Scheduler(proj).apply_async(Scheduler(proj).schedule["bad-args"], advance=False)
    tasks = all_tasks(proj)
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    publisher = _publisher(proj, path)
    ids = publisher.publish(
        [FireRequest(tasks[t], GLOBAL_TENANT, window) for t in ("bad-args", "crontab-plain")]
    )
    publisher.close()
    raw = broker.lrange("celery", 0, -1)
    assert sorted(json.loads(m)["headers"]["id"] for m in raw) == sorted(ids)
    assert {json.loads(m)["headers"]["argsrepr"] for m in raw} == {"[1, 2, 3, 4]", "()"}


def test_a_publish_signal_receiver_sees_and_changes_every_window_as_under_celerys_beat(
    proj, broker
):
    """Tracing instrumentation adds its header in ``before_task_publish``: with a receiver
    connected, windows the fast path would write go through Celery's path, which sends it."""
    from celery import signals

    def trace(headers=None, **_):
        headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    tasks = all_tasks(proj)
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    publisher = _publisher(proj, "redis-fast-path")
    signals.before_task_publish.connect(trace, weak=False)
    try:
        for task_id in ("crontab-plain", "cron-tenants"):
            tenant = "acme" if tasks[task_id].per_tenant else GLOBAL_TENANT
            req = FireRequest(tasks[task_id], tenant, window)
            reference = Scheduler(proj).schedule.get(task_id) or _declared_as_beat_entry(proj, req)
            Scheduler(proj).apply_async(reference, advance=False)
            _, beats = _take_one(broker)
            assert not _on_fast_path(publisher, req)
            _, ours = _take_one(broker)
            assert ours["headers"]["traceparent"] == beats["headers"]["traceparent"]
            _assert_as_beat_sends(ours, beats, EXTRA_HEADERS)
    finally:
        signals.before_task_publish.disconnect(trace)
    publisher.close()
