"""The demo's cron task and transition hook, loaded through CHECKBEAT_IMPORTS by
``checkbeat up --demo``."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery_app import cron, on_transition

log = logging.getLogger(__name__)


@cron("* * * * *", per_tenant=True, timeout=timedelta(seconds=30), id="demo.tenant_report")
def tenant_report(tenant: str) -> str:
    """Once a minute per demo tenant: what a real per-tenant report job would look like."""
    log.info("demo report for tenant %s", tenant)
    return tenant


@on_transition
def print_transition(transition) -> None:
    """Every change of a demo check's state, once (the worker-tasks log shows it)."""
    print(f"checkbeat demo transition: {transition.describe()}", flush=True)
