"""The check dispatcher as one of beat's drivers: ``Dispatcher(app)`` with ``interval`` and
``tick(now)``.

The dispatcher itself lives in :mod:`celery_app.dispatch`, because workers also claim (the slot
a finished run frees is refilled at once by :func:`celery_app.dispatch.refill_after_run`) and
beat and workers share code only through celery_app.
"""

from __future__ import annotations

from celery_app.dispatch import Claim, Dispatcher, RegionSlots, TickReport

__all__ = ["Claim", "Dispatcher", "RegionSlots", "TickReport"]
