"""Worker side of cron tasks: record each run's start, end, outcome and error in Redis.

Why signals: a cron task runs on a generic Celery worker, so the recording hooks into
``task_prerun`` / ``task_postrun`` / ``task_revoked`` and acts only on messages carrying the
``cron_*`` headers the publisher adds. The end of a run also releases the in-flight key, so the
next window of a singleton may fire. A failure here is logged, never raised into the worker;
an end that cannot be written because Redis is away is kept and written when it is back
(:mod:`celery_app.cron_tasks.late_records`).

Run at most once: the start of a run takes the window's run key (``Keys.cron_run``, SET NX in
``cron_start.lua``). A second delivery of a window (a takeover republished a claim whose first
publish was only slow, a broker redelivery) finds the key taken: it is counted as ``suppressed``
and logged, and :class:`CronRunTask` (the base of every ``@cron`` task) raises Celery's
``Ignore`` so its body never runs. A task that is not ``@cron``-declared but receives cron
messages (a ``beat_schedule`` entry fired by the engine) asks :func:`claim_run` instead. If
Redis cannot be reached at the start, the run goes ahead (it is logged): the window was
published, and not running it would lose it.

Which workers record: a worker importing this module says so in ``Keys.cron_recorders`` as it
starts, on its timer and at its cron runs, and removes itself at a clean shutdown
(:mod:`celery_app.cron_tasks.recorders`); list, diagnose and ``run --wait`` read it to tell "not
recorded" (plain Celery workers) from "lost".

On time: a window fired ahead of its start (``CHECKBEAT_CRON_LEAD``) waits in the prerun
handler until its start on Redis's clock, before the run key and the body
(:mod:`celery_app.cron_tasks.lead`); the task's message and body are unchanged.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from celery import Celery, Task, states
from celery.exceptions import Ignore, TimeLimitExceeded, WorkerLostError
from celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_revoked,
    worker_init,
    worker_ready,
    worker_shutdown,
)

from celery_app.cron_tasks import recorders
from celery_app.cron_tasks.cron_state import CronStore
from celery_app.cron_tasks.late_records import late_records
from celery_app.cron_tasks.lead import start_on_time, wait_locally
from celery_app.cron_tasks.registration import GLOBAL_TENANT, declaration_of
from celery_app.cron_tasks.sender import TENANT_KWARG, CronHeader
from celery_app.factory import settings_of
from celery_app.metrics import record as metrics
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronOutcome, CronStateField, Keys

log = logging.getLogger(__name__)

#: Set on a cron run's request by the prerun handler: False when the delivery is suppressed.
RUN_CLAIMED_ATTR = "checkbeat_cron_run_claimed"


@lru_cache(maxsize=8)
def _store(client: Any, keys: Keys, grace_s: float) -> CronStore:
    from datetime import timedelta

    return CronStore(client, keys, timedelta(seconds=grace_s))


def store_for(app: Celery) -> CronStore:
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    return _store(client, state_keys(settings), settings.cron_grace.total_seconds())


def _cron_headers(source: Any) -> tuple[str, str, str, bool] | None:
    get = source.get if isinstance(source, dict) else lambda name: getattr(source, name, None)
    task_id, tenant = get(CronHeader.TASK), get(CronHeader.TENANT)
    window = get(CronHeader.WINDOW)
    if not task_id or not tenant or not window:
        return None
    return str(task_id), str(tenant), str(window), bool(get(CronHeader.MANUAL))


def _error_text(exc: Any) -> str:
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
    return text[:2000]


def claim_run(request: Any) -> bool:
    """Whether the delivery of ``request`` may run its body: False for a second delivery of a
    cron window that already started (it is recorded as suppressed).

    For tasks that receive cron messages without being ``@cron`` tasks (e.g. a
    ``beat_schedule`` entry fired by the engine)::

        @app.task(bind=True)
        def report(self):
            if not claim_run(self.request):
                return  # this window already ran
            ...

    A request without cron headers (a plain call) may always run.
    """
    return getattr(request, RUN_CLAIMED_ATTR, True) is not False


class CronRunTask(Task):
    """The base of ``@cron`` tasks: a suppressed delivery (see :func:`claim_run`) raises
    ``Ignore`` before the body, so Celery records it as ignored and runs nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not claim_run(self.request):
            raise Ignore()
        return super().__call__(*args, **kwargs)


def _hard_limit(request: Any) -> float:
    limits = getattr(request, "timelimit", None) or (None, None)
    return float(limits[0] or 0.0)


_last_mark = float("-inf")  # monotonic time this process last refreshed its marker


def _mark_recorder(app: Celery, worker: str | None) -> None:
    """Refresh this worker's marker in ``Keys.cron_recorders`` (see
    :mod:`celery_app.cron_tasks.recorders`); never raises into the worker."""
    global _last_mark
    if not worker:
        return
    _last_mark = time.monotonic()
    try:
        settings = settings_of(app)
        client = get_redis(settings.redis_url, settings)
        recorders.mark(client, state_keys(settings), worker, time.time())
    except Exception as exc:
        log.warning("cron: could not say that %s records cron runs: %s", worker, exc)


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """A worker that imports this module records runs: say so as it starts (every worker,
    an embedded one too, sends this signal)."""
    app, worker = getattr(sender, "app", None), getattr(sender, "hostname", None)
    if app is not None and worker:
        _mark_recorder(app, worker)


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Once consuming (``celery worker``), keep saying so every REFRESH_S on its timer."""
    app, worker = getattr(sender, "app", None), getattr(sender, "hostname", None)
    if app is None or not worker:
        return
    _mark_recorder(app, worker)
    timer = getattr(sender, "timer", None)
    if timer is not None:
        timer.call_repeatedly(recorders.REFRESH_S, _mark_recorder, (app, worker))


@worker_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    app, worker = getattr(sender, "app", None), getattr(sender, "hostname", None)
    if app is None or not worker:
        return
    try:
        settings = settings_of(app)
        recorders.forget(get_redis(settings.redis_url, settings), state_keys(settings), worker)
    except Exception as exc:
        log.warning("cron: could not remove the recording marker of %s: %s", worker, exc)


@task_prerun.connect
def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    task = task or sender
    request: Any = getattr(task, "request", None)  # _cron_headers: None without one
    cron = _cron_headers(request)
    if cron is None:
        return
    if time.monotonic() - _last_mark >= recorders.REFRESH_S:
        # Also here: a worker started without the worker_ready signal (embedded, a pool
        # child whose parent's timer is not running) still says it records.
        _mark_recorder(task.app, getattr(request, "hostname", None))
    task_id, tenant, window, manual = cron
    try:
        first = start_on_time(
            store_for(task.app),
            task_id,
            tenant,
            window,
            manual,
            celery_id=request.id,
            hard_time_limit=_hard_limit(request),
        )
    except Exception:
        log.exception("cron: could not record the start of %s (%s, %s)", task_id, tenant, window)
        wait_locally(window)
        return
    setattr(request, RUN_CLAIMED_ATTR, first is None)
    metrics.cron_run_started(request, task_id, first is None)
    if first is not None:
        log.warning(
            "cron: suppressed delivery %s of %s (%s, window %s): %s already started it",
            request.id,
            task_id,
            tenant,
            window,
            first,
        )


def _record_end(
    app: Celery, task_id: str, tenant: str, window: str, outcome: CronOutcome, error: str
) -> None:
    """Record the end of a run (it releases the window's in-flight key); if Redis is away, the
    record is kept and written when it is back (:mod:`celery_app.cron_tasks.late_records`)."""
    at = datetime.now(UTC)
    what = f"the end of {task_id} ({tenant}, window {window}): {outcome}"
    try:
        store = store_for(app)
        late_records.write_or_keep(
            what, lambda: store.run_finished(task_id, tenant, window, outcome, error, at)
        )
    except Exception:
        log.exception("cron: could not record %s", what)


@task_postrun.connect
def _on_postrun(
    sender: Any = None, task: Any = None, retval: Any = None, state: str | None = None, **_: Any
) -> None:
    task = task or sender
    cron = _cron_headers(getattr(task, "request", None))
    if cron is None:
        return
    if not claim_run(task.request) or state == states.IGNORED:
        return  # a suppressed delivery: the run that started the window records its end
    if state is None:
        # The run was cut short (the pool is killing the child, e.g. at its hard time limit):
        # the parent reports it through task_failure, see _on_hard_time_limit.
        return
    task_id, tenant, window, _manual = cron
    ok = state == states.SUCCESS
    outcome = CronOutcome.SUCCESS if ok else CronOutcome.FAILURE
    metrics.cron_run_finished(task.request, task_id, outcome)
    _record_end(task.app, task_id, tenant, window, outcome, "" if ok else _error_text(retval))


@task_revoked.connect
def _on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    """An expired cron message never ran: record it, so the lost window shows in diagnose."""
    headers = getattr(request, "_request_dict", None) or {}
    cron = _cron_headers(headers)
    if cron is None:
        return
    task_id, tenant, window, _manual = cron
    outcome = CronOutcome.EXPIRED if expired else CronOutcome.REVOKED
    metrics.cron_run_finished(None, task_id, outcome)
    app = getattr(sender, "app", None) or getattr(request, "app", None)
    if app is None:
        from celery import current_app

        app = current_app
    _record_end(
        app, task_id, tenant, window, outcome, f"message {outcome} before it ran (window {window})"
    )


@task_failure.connect
def _on_hard_time_limit(
    sender: Any = None,
    task_id: str | None = None,
    exception: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    """A hard time limit or a lost pool child ends the run without a postrun of its own: the
    pool parent reports it here, without the message headers. The run is found by its Celery
    id in the state the child's prerun wrote."""
    declared = declaration_of(sender)
    lost = isinstance(exception, (TimeLimitExceeded, WorkerLostError))
    if not lost or declared is None:
        return
    tenant = GLOBAL_TENANT
    if declared.per_tenant:
        tenant = (kwargs or {}).get(TENANT_KWARG, GLOBAL_TENANT)
    try:
        store = store_for(sender.app)
        key = (declared.task_id, str(tenant))
        state = store.states([key])[key]
        if (
            state.get(CronStateField.CELERY_ID) != task_id
            or state.get(CronStateField.OUTCOME) != CronOutcome.RUNNING
        ):
            return
        store.run_finished(
            declared.task_id,
            str(tenant),
            state.get(CronStateField.LAST_RUN_WINDOW, ""),
            CronOutcome.FAILURE,
            _error_text(exception),
            datetime.now(UTC),
        )
        metrics.cron_run_finished(None, declared.task_id, CronOutcome.FAILURE)
    except Exception:
        log.exception("cron: could not record the hard time limit of %s", declared.task_id)
