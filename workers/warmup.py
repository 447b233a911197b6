"""Warm a check worker up before it registers its slots, so its first runs start on their tick.

Why: the first run of each pool thread used to pay for one-time work (the CA bundle, the refill
dispatcher and its broker connection, the routes of the run task): 0.3-0.6 s per first run on a
loaded machine, all eight threads at once, and the ticks due meanwhile started late. Done here,
in the worker's start-up, before any slot is offered to the dispatcher.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_app.checks.dispatch import warm_refill
from workers.probes.http import _tls_context

log = logging.getLogger(__name__)


def warm_up(app: Any) -> None:
    """Build the per-process objects every run uses; a failure only costs the first runs time."""
    try:
        _tls_context()
        warm_refill(app)
    except Exception as exc:  # the runs build them again when they need them
        log.warning("checkbeat: warming the worker up failed (%s); the first runs do it", exc)
