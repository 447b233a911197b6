"""Prefork workers: every pool child writes its series to files the parent sums when scraped.

Why: a prefork child records its runs in its own memory, which the parent (the process serving
``/metrics``) cannot see. prometheus_client's multiprocess mode keeps each process's values in
mmap files under ``PROMETHEUS_MULTIPROC_DIR``; :func:`collector` sums them, so a counter is the
total over every child, including children that exited (``--max-tasks-per-child``).

:func:`enable` must run in the parent before the pool forks (the worker bootstep does). It uses
``PROMETHEUS_MULTIPROC_DIR`` when set, emptying it first (stale files from an earlier run would
be added to the new counters), or a private temporary directory, removed at :func:`disable`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector

from celery_app.metrics.definitions import SHARED_METRICS, WORKER_METRICS

ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable() -> tuple[Path, bool]:
    """Switch this process (and the children it forks) to file-backed values; (dir, ours)."""
    given = os.environ.get(ENV)
    if given:
        path, ours = Path(given), False
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    else:
        path, ours = Path(tempfile.mkdtemp(prefix="checkbeat-metrics-")), True
        os.environ[ENV] = str(path)
    values.ValueClass = values.MultiProcessValue()
    # Beat's series are left alone: a worker never sets them, and a file-backed unlabelled
    # gauge would be exported as 0 (a beat that never ticked) from every worker.
    for metric in SHARED_METRICS + WORKER_METRICS:
        _rebind(metric)
    return path, ours


def _rebind(metric: object) -> None:
    """Give a metric defined before the switch file-backed values (its children are made
    again on their next ``labels()``; an unlabelled metric is its own value)."""
    children = getattr(metric, "_metrics", None)
    if children is not None:
        children.clear()
    if not getattr(metric, "_labelnames", ()):
        metric._metric_init()  # type: ignore[attr-defined]  # prometheus_client's own


def collector(path: Path) -> CollectorRegistry:
    """A registry whose collect() sums the files of every process under ``path``."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return registry


def disable(path: Path, ours: bool) -> None:
    if ours:
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get(ENV) == str(path):
            del os.environ[ENV]
