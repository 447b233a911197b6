"""The fault tests' witness of cron runs: task bodies that record every run they make, and the
reading of those records (lost windows and double runs are counted from them).

A test writes a module of cron tasks for its beat and worker processes (``CHECKBEAT_IMPORTS``,
tests/ on their PYTHONPATH) whose bodies are :func:`witnessed`; each run appends
``task|tenant|window|at`` to the Redis list :data:`RUNS` on the state Redis
(``CHECKBEAT_REDIS_URL``): ``at`` is when the body started, on the process's clock
(``clock_from_env``: the test clock where the test runs one). Importing this module connects to
nothing, so the test process reads the records with the same module.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import redis

from celery_app.cron_tasks.registration import GLOBAL_TENANT
from celery_app.wall_clock import clock_from_env

#: The Redis list the runs are appended to (the test's own db: emptied before each test).
RUNS = "faulttest:runs"


class Run(NamedTuple):
    task: str
    tenant: str
    window: str
    at: float  # when the body started, on the worker's clock (test clock), in Unix seconds

    @property
    def key(self) -> tuple[str, str, str]:
        """What a run is once at most: (task, tenant, window)."""
        return self.task, self.tenant, self.window


def witnessed(task_id: str) -> Callable[..., None]:
    """A body for a ``bind=True`` cron task (global or per tenant) that records its run."""
    state: dict[str, Any] = {}

    def run(self: Any, tenant: str = GLOBAL_TENANT) -> None:
        if "clock" not in state:  # in the worker, at its first run ("clock" set last)
            state["client"] = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
            state["clock"] = clock_from_env()
        at = state["clock"].now().timestamp()
        state["client"].rpush(RUNS, f"{task_id}|{tenant}|{self.request.cron_window}|{at}")

    return run


def recorded_runs(r: redis.Redis) -> list[Run]:
    """Every recorded run, in the order they started."""
    runs = []
    for member in r.lrange(RUNS, 0, -1):
        text = member.decode() if isinstance(member, bytes) else member
        task, tenant, window, at = text.split("|")
        runs.append(Run(task, tenant, window, float(at)))
    return runs


def run_counts(r: redis.Redis) -> Counter[tuple[str, str, str]]:
    """How many times each (task, tenant, window) ran: more than once is a double run."""
    return Counter(run.key for run in recorded_runs(r))
