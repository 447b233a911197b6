"""Cron messages: what a fired (task, tenant, window) is sent as, through the one publisher.

Every window is sent as Celery's beat sends an entry (``Scheduler.apply_async``:
``task.apply_async(args, kwargs, **options)``, ``app.send_task`` for a task the sending process
does not register), so the task's own time limits, ``ignore_result``, priority and routing, set on
the task, by ``task_annotations`` or by ``task_time_limit`` and the other ``task_*`` settings,
apply as under Celery's beat, with Celery's ``celery_beat_task`` header. A ``beat_schedule``
entry adds exactly its own options. An ``@cron`` task or a runtime schedule adds what it declares:
its timeout as soft and hard time limits, its window's deadline as ``expires`` (a message stuck
in a dead broker must not run hours late), its declared ``queue`` (set on the message itself, so
it holds in any app, also one that only set ``beat_scheduler`` and never installed checkbeat's
router). Three ``cron_*`` headers let the worker's signal handlers
(:mod:`celery_app.cron_tasks.recording`) record the run; a run-now (``schedule run``) is not
beat's send: it carries ``cron_manual`` instead of ``celery_beat_task``.
``tests/test_beat_messages.py`` holds every kind against Celery's beat, header by header. The
envelope and the batching are :mod:`celery_app.publish`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from celery import Celery

from celery_app.cron_tasks.cron_state import FireRequest, task_deadline
from celery_app.cron_tasks.registration import CronTask
from celery_app.publish import BatchPublisher, TaskMessage, make_publisher
from celery_app.redis.schema import CronSource

#: The keyword argument a per-tenant task is called with.
TENANT_KWARG = "tenant"
#: The header Celery's beat puts on every message it sends (``Scheduler.apply_async``).
BEAT_HEADER = "celery_beat_task"


class CronHeader(StrEnum):
    """Message headers of a cron run (read back by the worker's signal handlers)."""

    TASK = "cron_task"  # the cron task id
    TENANT = "cron_tenant"  # GLOBAL_TENANT for global tasks
    WINDOW = "cron_window"  # window id
    MANUAL = "cron_manual"  # True on a run-now only (absent: a scheduled window)


def cron_message(
    req: FireRequest,
    grace: timedelta,
    *,
    manual: bool = False,
    deadline: datetime | None = None,
) -> TaskMessage:
    """The task message of one fired request, sent as ``apply_async`` sends it.

    A beat_schedule entry is sent as Celery's beat sends it: its args and kwargs (lazy values
    called now) and its options (``queue``, ``routing_key``, ``exchange``, ``priority``,
    ``headers``, ``expires``, ``time_limit``, ...), nothing of ours but the ``cron_*`` headers.
    An ``@cron`` or runtime task adds its timeout, its window deadline and its declared queue.
    ``deadline`` is :func:`task_deadline`, when the caller has it (a window of thousands of
    messages computes it once).
    """
    task = req.task
    headers: dict[str, Any]
    if manual:
        headers = {
            CronHeader.TASK: task.id,
            CronHeader.TENANT: req.tenant,
            CronHeader.WINDOW: req.window_id,
            CronHeader.MANUAL: True,
        }
    elif task.source == CronSource.BEAT_SCHEDULE:
        headers = {
            CronHeader.TASK: task.id,
            CronHeader.TENANT: req.tenant,
            CronHeader.WINDOW: req.window_id,
        }
    else:
        headers = {
            BEAT_HEADER: True,
            CronHeader.TASK: task.id,
            CronHeader.TENANT: req.tenant,
            CronHeader.WINDOW: req.window_id,
        }
    args: Any  # a list from a beat entry (as beat sends it), else a tuple
    if task.source == CronSource.BEAT_SCHEDULE:
        args, kwargs = task.call_arguments()
        if task.per_tenant:
            kwargs[TENANT_KWARG] = req.tenant
        options = dict(task.options)
        own_headers = options.pop("headers", None) or {}
        beat = {} if manual else {BEAT_HEADER: True}
        return TaskMessage(
            name=task.name,
            args=args,  # a list, as beat sends it
            kwargs=kwargs,
            headers={**own_headers, **beat, **headers},
            options=options,
            as_apply_async=True,
        )
    if task.plain_message:
        kwargs = dict(task.kwargs) if task.kwargs else {}
        args = ()
    else:
        args, kwargs = task.call_arguments()
    if task.per_tenant:
        kwargs[TENANT_KWARG] = req.tenant
    return TaskMessage(
        name=task.name,
        queue=task.queue,
        args=args,
        kwargs=kwargs,
        time_limit=task.hard_time_limit,
        soft_time_limit=task.soft_time_limit,
        expires=deadline or task_deadline(task, req.window, grace),
        headers=headers,
        options=task.options,
        as_apply_async=True,
    )


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
