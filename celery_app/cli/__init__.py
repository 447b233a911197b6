"""Celery subcommands of checkbeat (entry point group ``celery.commands``).

Installed, ``celery -A celery_app schedule|tenants|checks ...`` finds them through the entry
points in pyproject. ``python -m celery_app.cli -A celery_app checks ...`` runs Celery's CLI
with them attached, for an uninstalled checkout.
"""

from __future__ import annotations

from celery_app.cli.checks import checks
from celery_app.cli.schedule import schedule
from celery_app.cli.tenants import tenants

COMMANDS = (schedule, tenants, checks)

__all__ = ["COMMANDS", "checks", "schedule", "tenants"]
