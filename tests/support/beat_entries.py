"""One set of beat_schedule entries that exercises every send option, shared by the tests that
hold our sends against Celery's own beat (``Scheduler.apply_async``)."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

#: The queues the entries land on: options route, the task's own route, the default queue.
QUEUES = ("q1", "tq", "celery")
#: Every routing and delivery option an entry may carry, as real projects set them.
ENTRY_OPTIONS = {
    "queue": "q1",
    "routing_key": "rk",
    "exchange": "ex",
    "priority": 5,
    "expires": 30,
    "headers": {"tenant": "acme"},
}


def add_entries_with_options(app: Celery) -> None:
    """Queues, a routed task ``proj.add`` and three entries: one with every option beat passes
    on (queue, routing_key, exchange, priority, expires, headers), one routed by the task's own
    ``task_routes``, and one for a task this app does not register (sent by name)."""
    app.conf.task_queues = [
        Queue("q1", Exchange("ex", type="direct"), routing_key="rk"),
        Queue("tq"),
        Queue("celery"),
    ]
    app.conf.task_routes = {"proj.add": {"queue": "tq"}}

    @app.task(name="proj.add", shared=False)
    def add(x, y=0):
        return x + y

    app.conf.beat_schedule = {
        "with-options": {"task": "proj.add", "schedule": 20, "args": (1,), "kwargs": {"y": 2},
                         "options": ENTRY_OPTIONS},
        "own-routing": {"task": "proj.add", "schedule": 20, "args": [3]},
        "unregistered": {"task": "remote.job", "schedule": 20, "kwargs": {"a": "b"}},
    }  # fmt: skip


def message_shape(message: Any) -> tuple:
    """What must match between beat's send and ours: task, args, kwargs, a header option,
    expiry set, priority, exchange and routing key."""
    h = message.headers
    return (
        h["task"],
        h["argsrepr"],
        h["kwargsrepr"],
        h.get("tenant"),
        h["expires"] is not None,
        message.properties.get("priority"),
        message.delivery_info["exchange"],
        message.delivery_info["routing_key"],
    )
