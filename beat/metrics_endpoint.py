"""Beat's metrics server and health: ``/metrics``, ``/metrics/checks`` and ``/healthz``.

Why the health rule is "ticked within twice its interval": a beat whose loop is stuck (a hung
Redis call, a deadlock) still answers a ping, but its tick stops; the interval is what the last
tick said it would sleep (Celery's Service sleeps exactly that), at least ``MIN_INTERVAL_S``.
Before the first tick the beat is not healthy (Kubernetes: give it a startupProbe).

Off unless ``CHECKBEAT_METRICS_ADDR`` is set; the series are recorded either way (cheap).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import generate_latest

from celery_app.checks.metrics_exporter import CheckExporter
from celery_app.checks.metrics_state import CheckStateCollector
from celery_app.factory import settings_of
from celery_app.metrics import record
from celery_app.metrics.server import (
    Collected,
    Credentials,
    MetricsServer,
    PageError,
    Reply,
    default_collector,
    health_page,
    metrics_page,
    start_or_log,
)
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys

MIN_INTERVAL_S = 1.0


class BeatHealth:
    """When the loop last finished a tick and how long it meant to sleep."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None  # monotonic end of the last tick
        self._sleep = MIN_INTERVAL_S

    def ticked(self, sleep: float, now: float | None = None) -> None:
        with self._lock:
            self._last = time.monotonic() if now is None else now
            self._sleep = max(MIN_INTERVAL_S, float(sleep))

    def check(self, now: float | None = None) -> tuple[bool, dict[str, Any]]:
        """(healthy, details); ``now`` is a ``time.monotonic()`` reading (tests pass one)."""
        with self._lock:
            last, sleep = self._last, self._sleep
        if last is None:
            return False, {"reason": "no tick yet"}
        age, limit = (time.monotonic() if now is None else now) - last, 2 * sleep
        detail: dict[str, Any] = {"last_tick_age_s": round(age, 3), "limit_s": round(limit, 3)}
        if age > limit:
            detail["reason"] = "the beat loop has not ticked within twice its interval"
        return age <= limit, detail


class _Bytes:
    """A collector of ready families (one exporter page)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def checks_page(exporter: CheckExporter) -> Any:
    def page(query: Mapping[str, str]) -> Reply:
        text = query.get("page", "0")
        if not text.isdigit() or int(text) > 1_000_000:
            raise PageError(f"page must be an integer from 0 to 1000000, got {text!r}")
        body = generate_latest(_Bytes(exporter.page(int(text))))
        return Reply(200, body, CONTENT_TYPE_LATEST)

    return page


class BeatObserver:
    """Records the tick series; serves them when ``CHECKBEAT_METRICS_ADDR`` is set."""

    def __init__(self, app: Any, beat_id: str, task_ids: Iterable[str] = ()) -> None:
        self.health = BeatHealth()
        self.server: MetricsServer | None = None
        self.exporter: CheckExporter | None = None
        self.beat_id = beat_id
        settings = settings_of(app)
        record.initialise_beat(settings.regions, task_ids)
        if not settings.metrics_addr:
            return
        client = get_redis(settings.redis_url, settings)
        broker = get_redis(settings.effective_broker_url, settings)
        keys = state_keys(settings)
        state = CheckStateCollector(client, broker, keys, settings.regions)
        exporter = CheckExporter(client, keys, settings.metrics_checks_page_size)
        self.exporter = exporter.start_refresh()
        pages = {
            "/metrics": metrics_page(Collected(default_collector(), state)),
            "/metrics/checks": checks_page(exporter),
            "/healthz": health_page(self.health.check),
        }
        name = f"beat@{socket.gethostname()}:{os.getpid()}"
        self.server = start_or_log(
            MetricsServer(
                settings.metrics_addr,
                pages,
                name=name,
                role="beat",
                client=client,
                keys=keys,
                credentials=Credentials.of(settings),
            )
        )

    def ticked(self, started: float, sleep: float) -> float:
        """After each tick (``started``: its perf_counter); returns ``sleep``."""
        record.beat_tick(started)
        self.health.ticked(sleep)
        return sleep

    def stop(self) -> None:
        if self.exporter is not None:
            self.exporter.stop_refresh()
        if self.server is not None:
            self.server.stop()
            self.server = None
