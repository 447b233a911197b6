"""A clock-step scenario: a true-clock engine and a stepped one tick side by side.

Why in-process: a real beat's wall clock cannot be stepped from a test (the test clock is fixed
at process start), so both engines get explicit wall times and one steady clock that follows
true time, as ``beat.CronScheduler`` gives its engine ``time.monotonic``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import redis
from celery import Celery

from beat.cron_engine import STEP_HOLD
from support.cron import T0, end_runs, make_engine

TICK = timedelta(seconds=10)


class Steady:
    """Seconds of true time, whatever the wall clock says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_stepped(
    app: Celery,
    r: redis.Redis,
    until: timedelta,
    step: Callable[[timedelta], timedelta],
    *,
    step_hold: timedelta = STEP_HOLD,
) -> dict[str, list[tuple[datetime, datetime]]]:
    """Tick both engines every 10 s of true time from T0 to ``until`` (the stepped one's wall
    clock is ahead by ``step(elapsed)``); return the (true time, window) each engine fired."""
    steady = Steady()
    engines = {"true": make_engine(app, owner="beat:true")}
    engines["stepped"] = make_engine(app, owner="beat:stepped")
    for engine in engines.values():
        engine.steady = steady
        engine.step_hold = step_hold
    fired: dict[str, list[tuple[datetime, datetime]]] = {name: [] for name in engines}
    elapsed = timedelta(seconds=1)
    while elapsed <= until:
        true_now = T0 + elapsed
        steady.now = elapsed.total_seconds()
        for name in ("stepped", "true"):
            wall = true_now + (step(elapsed) if name == "stepped" else timedelta(0))
            fired[name] += [(true_now, f.window) for f in engines[name].tick(wall).fired]
        end_runs(r)
        elapsed += TICK
    return fired
