"""Helpers shared by the subcommands: load the user's modules, report errors plainly."""

from __future__ import annotations

import click
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
