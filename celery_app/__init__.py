"""checkbeat's Celery application, registries and Redis state.

``celery -A celery_app worker|beat|schedule|checks`` resolves ``celery_app.app``.
"""

import importlib

from celery_app import cron_signals  # noqa: F401  (connects the worker-side run recording)
from celery_app.app import create_app, settings_of
from celery_app.cron import cron
from celery_app.settings import Settings, get_settings, load_settings
from celery_app.tenants import tenants_provider

app = create_app()


def _import_user_modules() -> None:
    """Import CHECKBEAT_IMPORTS now, not only when a worker starts: a bad cron spec must fail
    every ``celery -A celery_app ...`` command, naming the task, the spec and the token."""
    for module in settings_of(app).imports:
        importlib.import_module(module)


_import_user_modules()

__all__ = [
    "Settings",
    "app",
    "create_app",
    "cron",
    "get_settings",
    "load_settings",
    "settings_of",
    "tenants_provider",
]
