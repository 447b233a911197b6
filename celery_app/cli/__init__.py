"""Celery subcommands of checkbeat (entry point group ``celery.commands``).

Installed, ``celery -A celery_app schedule ...`` finds them through the entry points in
pyproject. ``python -m celery_app.cli -A celery_app schedule ...`` runs Celery's CLI with them
attached, for an uninstalled checkout.
"""

from __future__ import annotations

from celery_app.cli.schedule import schedule
from celery_app.cli.tenants import tenants

COMMANDS = (schedule, tenants)

__all__ = ["COMMANDS", "schedule", "tenants"]
