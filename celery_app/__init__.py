"""checkbeat's public API: the decorators, the settings, the ready-made Celery app, and
:func:`install` for an app of the user's own.

``celery -A celery_app ...`` reads ``celery_app.app``. It is built on first access, never at
import: importing any checkbeat module builds no app and imports no user module. Building it
reads the environment (:func:`get_settings`) and imports the modules named in
``CHECKBEAT_IMPORTS``, so a bad cron spec there still fails every ``celery -A celery_app ...``
command, naming the task, the spec and the token.

A bad ``CHECKBEAT_*`` value fails the build with a SettingsError naming the variable. Celery's
CLI would print that as a traceback of its own app loader (celery/bin/celery.py formats any
error raised while finding the app), so under that CLI the error is printed as the one message
it is and the command exits with status 2, like a usage error.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import TYPE_CHECKING, Any


def _refuse_foreign_scheduling_core() -> None:
    """Every module of this package imports ``scheduling_core`` (the error base first), so a
    project's own ``scheduling_core`` first on sys.path (``python -m celery``, ``PYTHONPATH=.``)
    would fail the import below naming neither module. It is named here, before anything
    imports it (``celery_app.shadowing`` imports nothing of checkbeat): under Celery's command
    line one line and exit 2, as the other clashes; elsewhere an ImportError saying the same."""
    from celery_app.shadowing import clashes

    found = clashes(["scheduling_core"])
    if not found:
        return
    if "celery.bin.celery" in sys.modules:
        print(f"Error: {found[0]}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(str(found[0]))


_refuse_foreign_scheduling_core()

from celery_app.checks.hooks import on_transition  # noqa: E402
from celery_app.cron_tasks.registration import cron  # noqa: E402
from celery_app.cron_tasks.tenants_provider import tenants_provider  # noqa: E402
from celery_app.factory import create_app, exit_under_celery_cli, install, settings_of  # noqa: E402
from celery_app.settings import Settings, SettingsError, get_settings, load_settings  # noqa: E402

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
    """``celery_app.app``: the ready-made app, built once, on first use; ``uptime_report`` and
    ``ping_heartbeat`` (``checks.heartbeat.ping``), imported on first use (they pull in the
    Redis client)."""
    if name == "uptime_report":
        from celery_app.checks.uptime import uptime_report

        return uptime_report
    if name == "ping_heartbeat":
        from celery_app.checks.heartbeat import ping

        return ping
    if name != "app":
        raise AttributeError(f"module 'celery_app' has no attribute {name!r}")
    with _build_lock:
        if "app" not in globals():
            try:
                globals()["app"] = _build_app()
            except SettingsError as exc:
                exit_under_celery_cli(exc)
                raise
    return globals()["app"]


__all__ = [
    "Settings",
    "app",
    "create_app",
    "cron",
    "get_settings",
    "install",
    "load_settings",
    "on_transition",
    "ping_heartbeat",
    "settings_of",
    "tenants_provider",
    "uptime_report",
]
