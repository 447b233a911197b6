"""The base of every error checkbeat raises for a caller to show or handle.

Defined here, at the bottom of the layers, so scheduling_core's own errors (``CronError``,
``CeleryCrontabError``) share it; :mod:`celery_app.errors` re-exports it as the one name the
rest of the code and users catch. Each error also keeps the builtin base it had
(``class CronError(CheckbeatError, ValueError)``), so an ``except ValueError`` catches what it
always caught.
"""

from __future__ import annotations


class CheckbeatError(Exception):
    """An error of checkbeat; ``field`` names the input it is about, where there is one (a check
    field, a schedule field, a bounded input), else None."""

    field: str | None = None
