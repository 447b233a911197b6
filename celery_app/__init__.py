"""checkbeat's public API: the decorators, the settings, and the ready-made Celery app.

``celery -A celery_app ...`` reads ``celery_app.app``. It is built on first access, never at
import: importing any checkbeat module builds no app and imports no user module. Building it
imports the modules named in ``CHECKBEAT_IMPORTS``, so a bad cron spec there still fails every
``celery -A celery_app ...`` command, naming the task, the spec and the token.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

from celery_app.cron_tasks.registration import cron
from celery_app.cron_tasks.tenants import tenants_provider
from celery_app.factory import create_app, settings_of
from celery_app.settings import Settings, get_settings, load_settings

if TYPE_CHECKING:
    from celery import Celery

    app: Celery

_build_lock = threading.Lock()


def _build_app() -> Celery:
    built = create_app()
    for module in settings_of(built).imports:
        importlib.import_module(module)
    return built


def __getattr__(name: str) -> Any:
    """``celery_app.app``: the ready-made app, built once, on first use."""
    if name != "app":
        raise AttributeError(f"module 'celery_app' has no attribute {name!r}")
    with _build_lock:
        if "app" not in globals():
            globals()["app"] = _build_app()
    return globals()["app"]


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
