"""checkbeat's Celery application, registries and Redis state.

``celery -A celery_app worker|beat|schedule|checks`` resolves ``celery_app.app``.
"""

from celery_app import cron_signals  # noqa: F401  (connects the worker-side run recording)
from celery_app.app import create_app, settings_of
from celery_app.cron import cron
from celery_app.settings import Settings, get_settings, load_settings
from celery_app.tenants import tenants_provider

app = create_app()

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
