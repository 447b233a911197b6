"""Helpers shared by the subcommands: load the user's modules, report errors plainly."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import redis
from celery import Celery


def load_app(ctx: click.Context) -> Celery:
    """The ``-A`` app with the user modules (CHECKBEAT_IMPORTS) imported, so their cron tasks
    and providers exist; a bad declaration fails the command with its message."""
    app = ctx.obj.app
    try:
        app.loader.import_default_modules()
    except ValueError as exc:  # CronSpecError, TenantError, SettingsError
        raise click.ClickException(str(exc)) from None
    return app


def redis_errors_as_messages(fun: Callable[..., Any]) -> Callable[..., Any]:
    """A Redis outage is an operator-facing message and exit code 1, not a traceback."""

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fun(*args, **kwargs)
        except redis.RedisError as exc:
            raise click.ClickException(f"cannot reach checkbeat's Redis: {exc}") from None

    return wrapper
