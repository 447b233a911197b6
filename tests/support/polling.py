"""Waiting for real processes without sleeping a fixed time: poll with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str | Callable[[], str] = "",
) -> object:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds.

    ``what`` names what was awaited in the failure; a callable is called only then, so it can
    describe the state at the deadline (the processes' logs, what is still missing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {said or predicate}")
        time.sleep(interval)
