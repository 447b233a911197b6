"""Warm a check worker up before it registers its slots, so its first runs start on their tick.

Why: otherwise the first run of each pool thread pays for one-time work (the CA bundle, the
refill dispatcher and its broker connection, the routes of the run task, the Lua scripts, read
here and loaded on the server), all threads at once, and the ticks due meanwhile start late.
Done here, in the worker's start-up, before
any slot is offered to the dispatcher.
Each object is built with the arguments the runs use (a cached call with other arguments is
another cache entry: warming ``_tls_context()`` does nothing for a probe that asks for
``_tls_context(None)``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery_app.checks.dispatch import warm_refill
from celery_app.factory import settings_of
from celery_app.redis.client import get_redis
from celery_app.redis.scripts import build_all, load_all
from workers.probes.http import tls_context

log = logging.getLogger(__name__)


def warm_up(app: Any) -> None:
    """Build the per-process objects every run uses; a failure only costs the first runs time."""
    try:
        settings = settings_of(app)
        tls_context(settings.probe_tls_ca_file)
        build_all()
        load_all(get_redis(settings.redis_url, settings))  # no NOSCRIPT re-runs in the runs
        warm_refill(app)
    except Exception as exc:  # the runs build them again when they need them
        log.warning("checkbeat: warming the worker up failed (%s); the first runs do it", exc)
