"""The base of checkbeat's errors, and the errors of the check store that callers (CLI, API)
show to users as they are.

:class:`CheckbeatError` is defined in :mod:`scheduling_core.errors` (the pure layer's errors
derive from it too) and re-exported here: catch ``celery_app.errors.CheckbeatError`` for any
error of checkbeat. Each error class keeps its builtin base as well (``ValueError``,
``KeyError``, ...), so handlers written for those are unchanged.
"""

from __future__ import annotations

from scheduling_core.errors import CheckbeatError

__all__ = ["CheckExists", "CheckFieldError", "CheckNotFound", "CheckbeatError", "ConcurrentUpdate"]


class CheckFieldError(CheckbeatError, ValueError):
    """A check definition is invalid; ``field`` names the offending field.

    The message reads ``<field>: <what is wrong> (<what is allowed>)`` so the CLI can print it
    unchanged and nothing has been written when it is raised.
    """

    field: str  # always named

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class CheckNotFound(CheckbeatError, KeyError):
    """No check with this uid exists."""

    def __str__(self) -> str:
        return f"no check with uid {self.args[0]!r}"


class CheckExists(CheckbeatError, ValueError):
    """``create`` was asked for a uid that already exists (use update)."""


class ConcurrentUpdate(CheckbeatError, RuntimeError):
    """The check changed between read and write more often than we retry."""
