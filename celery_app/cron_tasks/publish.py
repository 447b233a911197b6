"""Cron messages: what a fired (task, tenant, window) is sent as, through the one publisher.

Every message carries the window's deadline as ``expires`` (a message stuck in a dead broker must
not run hours late), the task's timeout as soft and hard time limits, and ``cron_*`` headers the
worker's signal handlers (:mod:`celery_app.cron_tasks.recording`) use to record the run. A
task's declared ``queue`` is set on the message itself, so it holds in any app, also one that
only set ``beat_scheduler`` and never installed checkbeat's router; otherwise the app's router
decides. The envelope and the batching are :mod:`celery_app.publish`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from celery import Celery

from celery_app.cron_tasks.registration import CronTask
from celery_app.cron_tasks.store import FireRequest, task_deadline
from celery_app.publish import BatchPublisher, TaskMessage, make_publisher
from celery_app.redis.schema import CronSource

#: The keyword argument a per-tenant task is called with.
TENANT_KWARG = "tenant"


class CronHeader(StrEnum):
    """Message headers of a cron run (read back by the worker's signal handlers)."""

    TASK = "cron_task"  # the cron task id
    TENANT = "cron_tenant"  # GLOBAL_TENANT for global tasks
    WINDOW = "cron_window"  # window id
    MANUAL = "cron_manual"  # True for a run-now


def cron_message(
    req: FireRequest,
    grace: timedelta,
    *,
    manual: bool = False,
    deadline: datetime | None = None,
) -> TaskMessage:
    """The task message of one fired request (its declared queue, else the app's router).

    A beat_schedule entry is sent as Celery's beat sends it: its args and kwargs (lazy values
    called now), its options (``queue``, ``routing_key``, ``exchange``, ``priority``,
    ``headers``, ``expires``, ...), no time limits and no window deadline of ours (the task's
    own limits apply; it expires only if its options say so); the ``cron_*`` headers are added
    so the worker records the run. ``deadline`` is :func:`task_deadline`, when the caller has
    it (a window of thousands of messages computes it once).
    """
    task = req.task
    headers: dict[str, Any] = {
        CronHeader.TASK: task.id,
        CronHeader.TENANT: req.tenant,
        CronHeader.WINDOW: req.window_id,
        CronHeader.MANUAL: manual,
    }
    expires = deadline or task_deadline(task, req.window, grace)
    if task.plain_message:
        kwargs = dict(task.kwargs) if task.kwargs else {}
        if task.per_tenant:
            kwargs[TENANT_KWARG] = req.tenant
        return TaskMessage(
            name=task.name,
            queue=task.queue,
            kwargs=kwargs,
            time_limit=task.hard_time_limit,
            soft_time_limit=task.soft_time_limit,
            expires=expires,
            headers=headers,
        )
    args, kwargs = task.call_arguments()
    if task.per_tenant:
        kwargs[TENANT_KWARG] = req.tenant
    options = dict(task.options)
    queue = options.pop("queue", None) or task.queue
    own_headers = options.pop("headers", None) or {}
    beat = task.source == CronSource.BEAT_SCHEDULE
    given = options.pop("expires", None)
    if given is not None:
        expires = given if isinstance(given, datetime) else _seconds_from_now(given)
    elif beat:
        expires = None  # beat sends none: a late message runs late, as under Celery's beat
    return TaskMessage(
        name=task.name,
        queue=queue if isinstance(queue, str) else None,
        args=args,  # a list, as beat sends it
        kwargs=kwargs,
        time_limit=None if beat else task.hard_time_limit,
        soft_time_limit=None if beat else task.soft_time_limit,
        expires=expires,
        headers={**own_headers, **headers},
        options=options if isinstance(queue, str) or queue is None else {**options, "queue": queue},
    )


def _seconds_from_now(seconds: float) -> datetime:
    """``expires=<seconds>`` as ``apply_async`` reads it: from the send."""
    return datetime.now(UTC) + timedelta(seconds=float(seconds))


class CronPublisher:
    """Sends fired requests (the engine's and run-now's sender); raises if the batch could not
    be published."""

    def __init__(
        self, app: Celery, grace: timedelta, publisher: BatchPublisher | None = None
    ) -> None:
        self.grace = grace
        self.publisher = publisher or make_publisher(app)

    def prepare(self, tasks: Iterable[CronTask]) -> None:
        """Resolve every task's route once, so the first window publishes as fast as the rest."""
        self.publisher.prepare(task.name for task in tasks)

    def publish(self, requests: Sequence[FireRequest], *, manual: bool = False) -> list[str]:
        """Publish one message per request; return the Celery task ids, in order."""
        if not requests:
            return []
        grace = self.grace
        deadlines: dict[tuple[datetime, timedelta, timedelta | None], datetime] = {}
        messages = []
        for req in requests:
            task = req.task
            memo = (req.window, task.window_length, task.grace)
            deadline = deadlines.get(memo)
            if deadline is None:
                deadline = deadlines[memo] = task_deadline(task, req.window, grace)
            messages.append(cron_message(req, grace, manual=manual, deadline=deadline))
        return self.publisher.publish(messages)

    def close(self) -> None:
        self.publisher.close()
