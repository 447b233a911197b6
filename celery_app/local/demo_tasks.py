"""The demo's cron task, loaded through CHECKBEAT_IMPORTS by ``checkbeat up --demo``."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery_app import cron

log = logging.getLogger(__name__)


@cron("* * * * *", per_tenant=True, timeout=timedelta(seconds=30), id="demo.tenant_report")
def tenant_report(tenant: str) -> str:
    """Once a minute per demo tenant: what a real per-tenant report job would look like."""
    log.info("demo report for tenant %s", tenant)
    return tenant
