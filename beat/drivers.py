"""The periodic drivers CronScheduler runs besides the cron engine.

Why a list built in one function: the check dispatcher (and anything else that must run every
few seconds inside beat) plugs in here without touching the scheduler. A driver is any object
with ``interval`` (seconds) and ``tick(now)``; CronScheduler calls it every ``interval`` and
sleeps until the earliest thing due.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from celery import Celery

from beat.dispatcher import Dispatcher


@runtime_checkable
class Driver(Protocol):
    interval: float

    def tick(self, now: datetime) -> object: ...


def build_drivers(app: Celery) -> list[Driver]:
    """Every driver beat runs for ``app``: the check dispatcher."""
    return [Dispatcher(app)]
