"""The worker bootstep that serves ``/metrics`` and ``/healthz`` (``CHECKBEAT_METRICS_ADDR``).

Why a bootstep: its ``__init__`` runs in the worker's main process before the pool forks, which
is when a prefork worker must switch to multiprocess values (:mod:`celery_app.metrics.
multiprocess`) so every child's runs are summed into the one ``/metrics`` the parent serves;
start/stop follow the worker's life, so the endpoint goes away on a warm shutdown.

Healthy (``/healthz`` 200) when the consumer runs with a broker connection and the broker
answers a ping, and, for a check worker, its capacity registration exists in Redis (what the
dispatcher reads: without it no work is claimed for the worker).
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Any

from celery import bootsteps
from prometheus_client.core import GaugeMetricFamily

from celery_app.checks.abandon import AbandonReason
from celery_app.checks.run_contract import RunStatus
from celery_app.factory import settings_of
from celery_app.metrics import multiprocess, record
from celery_app.metrics.server import (
    Collected,
    Credentials,
    MetricsServer,
    default_collector,
    health_page,
    metrics_page,
    start_or_log,
)
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronOutcome
from celery_app.registry import registry_of
from workers.roles import WorkerRole, parse_check_queue
from workers.worker_step import CheckWorkerStep

log = logging.getLogger(__name__)


def is_prefork(pool_cls: Any) -> bool:
    from celery.concurrency.prefork import TaskPool

    return isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)


class WorkerHealth:
    """The health rule above, and the worker's own gauges (``collect``)."""

    def __init__(self, w: Any) -> None:
        self.w = w
        settings = settings_of(w.app)
        self.client = get_redis(settings.redis_url, settings)
        self.broker = get_redis(settings.effective_broker_url, settings)
        self.keys = state_keys(settings)

    @property
    def role(self) -> WorkerRole | None:
        for step in getattr(self.w, "steps", ()):
            if isinstance(step, CheckWorkerStep):
                return step.plan
        return None

    def check(self) -> tuple[bool, dict[str, Any]]:
        consumer: Any = getattr(self.w, "consumer", None)
        detail: dict[str, Any] = {"hostname": self.w.hostname}
        run_state = bootsteps.RUN  # type: ignore[attr-defined]  # not in celery-types
        running = consumer is not None and consumer.blueprint.state == run_state
        connected = running and consumer.connection is not None
        try:
            broker = bool(self.broker.ping())
        except Exception as exc:
            broker, detail["broker_error"] = False, f"{type(exc).__name__}: {exc}"
        detail["broker_connected"] = connected and broker
        role = self.role
        registered = True
        if role is not None:
            try:
                registered = bool(self.client.exists(self.keys.worker(self.w.hostname)))
            except Exception as exc:
                registered, detail["redis_error"] = False, f"{type(exc).__name__}: {exc}"
            detail["capacity_registered"] = registered
            detail["role"], detail["region"] = role.role, role.region
        return detail["broker_connected"] and registered, detail

    def collect(self) -> list[Any]:
        ok, _detail = self.check()
        healthy = GaugeMetricFamily(
            "checkbeat_worker_healthy", "1 when this worker's /healthz passes (see docs)."
        )
        healthy.add_metric([], 1 if ok else 0)
        slots = GaugeMetricFamily(
            "checkbeat_worker_slots",
            "Probe slots this check worker registered, by region and role.",
            labels=["region", "role"],
        )
        role = self.role
        if role is not None:
            slots.add_metric([role.region, role.role], role.concurrency)
        return [healthy, slots]


class MetricsStep(bootsteps.StartStopStep):
    """Serves the worker's metrics and health; multiprocess values under a prefork pool."""

    label = "checkbeat metrics"

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        self.address = settings_of(w.app).metrics_addr
        self.enabled = bool(self.address)
        self._dir: tuple[Path, bool] | None = None
        if self.enabled and is_prefork(getattr(w, "pool_cls", None)):
            self._dir = multiprocess.enable()
            # At the main process's exit: pool children leave with os._exit and run no atexit.
            atexit.register(multiprocess.disable, *self._dir)
            log.info("metrics: prefork children write their series under %s", self._dir[0])

    def start(self, w: Any) -> None:
        health = WorkerHealth(w)
        declared = [d.task_id for d in registry_of(w.app).cron_declarations()]
        record.initialise_cron_runs(declared, [CronOutcome.SUCCESS, CronOutcome.FAILURE])
        role = health.role
        if role is not None:
            lanes = [parsed[1] for q in role.queues if (parsed := parse_check_queue(q))]
            statuses, reasons = [str(s) for s in RunStatus], [str(r) for r in AbandonReason]
            record.initialise_worker(role.region, lanes, statuses, reasons)
        values = (
            multiprocess.collector(self._dir[0]) if self._dir is not None else default_collector()
        )
        pages = {
            "/metrics": metrics_page(Collected(values, health)),
            "/healthz": health_page(health.check),
        }
        self.server = start_or_log(
            MetricsServer(
                self.address,
                pages,
                name=f"worker@{w.hostname}",
                role="worker",
                client=health.client,
                keys=health.keys,
                credentials=Credentials.of(settings_of(w.app)),
            )
        )

    def stop(self, w: Any) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
            self.server = None

    terminate = stop  # type: ignore[assignment]  # the same: nothing to close more gently
