"""One time budget per probe run, shared by every step of it.

Why: a socket timeout bounds one operation, not a run. A server that drips its headers one byte
every 0.3 s answers every read within a 2 s read timeout and so holds the worker slot for as long
as it likes; a name with six black-holed addresses costs six connect timeouts. A probe makes one
:class:`Deadline` when it starts and gives each operation ``min(per-op timeout, remaining())``;
when the budget is spent the next operation raises :class:`DeadlineExceeded` instead of starting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from celery_app.errors import CheckbeatError

#: Attribute set on a probe function by :func:`honours_deadline`.
HONOURS_DEADLINE_ATTR = "__checkbeat_honours_deadline__"

F = TypeVar("F", bound=Callable[..., object])


class DeadlineExceeded(CheckbeatError, TimeoutError):
    """A probe's time budget is spent (a TimeoutError: callers that catch timeouts catch it)."""


class Deadline:
    """``timeout_s`` from now on a monotonic clock. Immutable; cheap to pass down."""

    __slots__ = ("_clock", "ends_at", "started_at", "timeout_s")

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._clock = clock
        self.timeout_s = float(timeout_s)
        self.started_at = clock()
        self.ends_at = self.started_at + self.timeout_s

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.ends_at - self._clock())

    @property
    def expired(self) -> bool:
        return self._clock() >= self.ends_at

    def elapsed_ms(self) -> float:
        return (self._clock() - self.started_at) * 1000.0

    def check(self, what: str = "the probe") -> None:
        """Raise :class:`DeadlineExceeded` (naming ``what``) if the budget is spent."""
        if self.expired:
            raise DeadlineExceeded(f"{what} did not finish within {self.timeout_s:g} s")

    def bound(self, per_op: float | None = None, what: str = "the probe") -> float:
        """The timeout for the next operation: ``min(per_op, remaining())``, always > 0.

        Raises :class:`DeadlineExceeded` instead of returning 0 (a socket timeout of 0 would
        mean non-blocking, not "no time left").
        """
        left = self.remaining()
        if left <= 0.0:
            raise DeadlineExceeded(f"{what} did not finish within {self.timeout_s:g} s")
        return left if per_op is None else min(per_op, left)

    def __repr__(self) -> str:
        return f"Deadline({self.timeout_s:g} s, {self.remaining():.3f} s left)"


def honours_deadline(probe: F) -> F:
    """Mark ``probe`` as returning by its context's deadline on its own (the built-ins do).

    The runner calls a marked probe inline; an unmarked (custom) probe on a worker thread runs in
    a helper thread the runner stops waiting for at the deadline (see :mod:`workers.runner`).
    """
    setattr(probe, HONOURS_DEADLINE_ATTR, True)
    return probe
