"""Errors of the check store that callers (CLI, API) show to users as they are."""

from __future__ import annotations


class CheckFieldError(ValueError):
    """A check definition is invalid; ``field`` names the offending field.

    The message reads ``<field>: <what is wrong> (<what is allowed>)`` so the CLI can print it
    unchanged and nothing has been written when it is raised.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class CheckNotFound(KeyError):
    """No check with this uid exists."""

    def __str__(self) -> str:
        return f"no check with uid {self.args[0]!r}"


class CheckExists(ValueError):
    """``create`` was asked for a uid that already exists (use update)."""


class ConcurrentUpdate(RuntimeError):
    """The check changed between read and write more often than we retry."""
