"""Firing a cron window a short lead ahead, and starting its run on the window's start.

Why: a window fired at its start reaches the body late by beat's wake-up, the claim, the
publish and the worker's delivery (one message per BRPOP: the last of a window's batch waits
for the others). So beat fires each window ``CHECKBEAT_CRON_LEAD`` before its start, and the
worker, before the run key and the body, waits until the start on Redis's clock
(``cron_start.lua`` reads ``TIME`` and refuses an early start), never the worker's own: a
worker whose clock is wrong still never starts a body early, and exactly-once is the run key's
as before (nothing is written while waiting).

The lead applies only when the workers are known to wait, i.e. run checkbeat's recording
handlers: an installed app (``install(app)``), an app that imports
``celery_app.cron_tasks.recording``, or one whose tasks are all ``@cron`` (their module
imports it). A plain worker would run a message fired ahead at once, early.

Under a test clock (``CHECKBEAT_TEST_CLOCK``, tests only) the window's simulated start is mapped
to the real instant it stands for, and that is waited for on Redis's clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from celery_app.cron_tasks.cron_state import CronStore, Early, parse_window_id
from celery_app.cron_tasks.registration import CronTask
from celery_app.factory import installed, settings_of
from celery_app.redis.schema import CronSource
from celery_app.wall_clock import Clock, clock_from_env
from scheduling_core.on_tick import MAX_LEAD_S

log = logging.getLogger(__name__)

RECORDING_MODULE = "celery_app.cron_tasks.recording"


def workers_wait(app: Any, tasks: Iterable[CronTask]) -> bool:
    """Whether the workers of ``app`` run the recording handlers (see the module docstring)."""
    if installed(app):
        return True
    conf = app.conf
    listed = (*(conf.imports or ()), *(conf.include or ()))
    if RECORDING_MODULE in listed:
        return True
    tasks = list(tasks)
    return bool(tasks) and all(task.source == CronSource.CRON for task in tasks)


def fire_lead(app: Any, tasks: Iterable[CronTask]) -> timedelta:
    """How far ahead of a window's start beat fires it: ``CHECKBEAT_CRON_LEAD``, or 0 when
    the workers would not wait."""
    lead = settings_of(app).cron_lead
    if lead <= 0:
        return timedelta(0)
    if not workers_wait(app, tasks):
        log.info("cron: windows fire at their start (workers may not run checkbeat's recording)")
        return timedelta(0)
    return timedelta(seconds=lead)


def real_instant(at: datetime, clock: Clock) -> datetime:
    """``at`` on the real clock (Redis's): itself, unless a test clock runs every process on a
    simulated time (``CHECKBEAT_TEST_CLOCK``), whose instant ``at`` is then mapped back."""
    if clock.start is None:
        return at
    real = clock.epoch + (at - clock.start).total_seconds() / clock.rate
    return datetime.fromtimestamp(real, UTC)


def start_on_time(
    store: CronStore,
    task_id: str,
    tenant: str,
    window: str,
    manual: bool,
    *,
    celery_id: str,
    hard_time_limit: float,
    max_wait_s: float = MAX_LEAD_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> str | None:
    """:meth:`CronStore.run_started` at or after the window's start on Redis's clock: a
    delivery fired ahead waits (in its worker slot) and asks again. Returns what
    ``run_started`` returns: None when this delivery runs, else the id of the one that ran.

    The wait is bounded by ``max_wait_s``: a delivery still early after it (a beat whose clock
    is far ahead of Redis's) starts then, and is logged.
    """
    start = real_instant(parse_window_id(window), clock_from_env())
    waited = 0.0
    began = time.monotonic()
    while True:
        not_before = start if waited < max_wait_s else None
        answer = store.run_started(
            task_id,
            tenant,
            window,
            manual,
            clock(),
            celery_id=celery_id,
            hard_time_limit=hard_time_limit,
            not_before=not_before,
        )
        if not isinstance(answer, Early):
            return answer
        pause = min(answer.wait_s, max_wait_s - waited)
        if pause <= 0 or waited + pause >= max_wait_s:
            log.warning(
                "cron: %s (%s, window %s) arrived %.1fs before its window on Redis's clock "
                "(is beat's clock ahead?); it starts after %.1fs",
                task_id,
                tenant,
                window,
                answer.wait_s + waited,
                max_wait_s,
            )
        sleep(max(pause, 0.0))
        waited = max(time.monotonic() - began, waited + max(pause, 0.0))


def wait_locally(window: str, sleep: Callable[[float], None] = time.sleep) -> None:
    """Redis unreachable at a run's start: the run goes ahead, but not before its window on
    this process's clock (at most :data:`MAX_LEAD_S`)."""
    try:
        start = real_instant(parse_window_id(window), clock_from_env())
    except ValueError:
        return
    early = (start - datetime.now(UTC)).total_seconds()
    if early > 0:
        sleep(min(early, MAX_LEAD_S))
