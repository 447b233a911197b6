"""The worker bootstep that turns ``--role fast|shared`` into queues, slots and a registration.

Why a bootstep: it runs inside ``celery worker`` before the pool and the consumer are built, so
it can set the queues and the concurrency of the role, and it has start/stop hooks on the
worker's own life cycle, so the capacity registration disappears on a warm shutdown. A plain
``celery worker`` for cron tasks consumes no check queue and registers nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.exceptions import ImproperlyConfigured

from celery_app.factory import settings_of
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from workers.roles import (
    CapacityRegistration,
    RoleError,
    WorkerRole,
    plan_role,
    role_from_queues,
)
from workers.runner import on_stuck_change, stuck_probes
from workers.warmup import warm_up

log = logging.getLogger(__name__)


def consume_without_acks(app: Any, queues: Any) -> None:
    """Consume the check queues ``queues`` with ``no_ack``: kombu keeps no unacked copy of a
    run message and Celery's ack of it sends nothing (``kombu_redis.AcksOnlyRecorded``).

    Why: the lease is a check run's delivery guarantee. A run whose worker dies is reaped at
    its lease expiry and rescheduled; the unacked copy only came back after the visibility
    timeout (an hour), to be dropped as stale. Recording and acking it cost two round trips
    to the broker per run, in the worker."""
    for name in queues:
        app.amqp.queues[name].no_ack = True


class CheckWorkerStep(bootsteps.StartStopStep):
    """Applies the role (``--role``/``--region``) and registers the worker's probe capacity."""

    label = "checkbeat capacity"
    requires = ("celery.worker.components:Pool",)

    def __init__(
        self,
        w: Any,
        checkbeat_role: str | None = None,
        checkbeat_region: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(w, **kwargs)
        settings = settings_of(w.app)
        plan: WorkerRole | None
        try:
            if checkbeat_role:
                # -Q was consumed before the steps are built; Queues keeps what it selected.
                if getattr(w.app.amqp.queues, "_consume_from", None):
                    raise RoleError("--role sets the queues itself: drop -Q/--queues")
                plan = plan_role(checkbeat_role, checkbeat_region, settings)
                w.setup_queues(list(plan.queues))
                w.concurrency = plan.concurrency
                if getattr(w, "max_concurrency", None) is None:
                    w.min_concurrency = plan.concurrency
            else:
                if checkbeat_region:
                    raise RoleError("--region only applies together with --role fast|shared")
                queues = w.app.amqp.queues
                consumed = list(queues.consume_from or queues)
                plan = role_from_queues(consumed, int(w.concurrency))
        except RoleError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        if plan is not None:
            consume_without_acks(w.app, plan.queues)
            # Fetch only when a slot is free: the backlog waits in Redis, in WFQ order (and
            # kombu's prefetch limit counts only acked deliveries).
            w.app.conf.worker_disable_prefetch = True
        self.plan = plan
        self.enabled = plan is not None
        self._settings = settings

    def create(self, w: Any) -> CapacityRegistration:  # type: ignore[override]  # kept as obj
        assert self.plan is not None
        warm_up(w.app)  # before the registration offers any slot
        return CapacityRegistration(
            get_redis(self._settings.redis_url, self._settings),
            state_keys(self._settings),
            w.hostname,
            self.plan,
            stuck=stuck_probes,
        )

    def start(self, w: Any) -> None:
        super().start(w)
        if self.obj is not None:  # a stuck probe thread's slot is reported as it changes
            self._unlisten = on_stuck_change(self.obj.report_stuck)

    def stop(self, w: Any) -> None:
        unlisten = getattr(self, "_unlisten", None)
        if unlisten is not None:
            unlisten()
        super().stop(w)
