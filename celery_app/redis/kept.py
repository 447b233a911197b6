"""Values a process read from Redis and keeps for a bounded time, per key name.

Why: a run's path goes by a few things that change rarely (the maintenance version, the tenants
with a bucket). Reading them on every run costs a command each; keeping them forever would
never see an operator's change. A kept reading is read again, on a round trip the caller makes
anyway, once it is ``max_age_s`` old, so a change reaches the process within that bound.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

T = TypeVar("T")

_NEVER = float("-inf")


class KeptReadings(Generic[T]):
    """The last reading of each key name, with when it was read (this process's monotonic
    clock). Threads share one: the calls are dict reads and writes, atomic under the GIL."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._kept: dict[str, tuple[float, T]] = {}  # name -> (read at, value)
        self._asked: dict[str, float] = {}  # name -> when a read of it was last taken on

    def last(self, name: str) -> T | None:
        """The last reading of ``name`` whatever its age; None if never read."""
        kept = self._kept.get(name)
        return None if kept is None else kept[1]

    def fresh(self, name: str) -> T | None:
        """The reading of ``name`` when read less than ``max_age_s`` ago, else None."""
        read_at, value = self._kept.get(name, (_NEVER, None))
        return value if time.monotonic() - read_at < self.max_age_s else None

    def due(self, name: str) -> bool:
        """Whether to read ``name`` again now. True also takes the read on: callers of the same
        instant (many threads starting runs) queue one read between them, not one each."""
        now = time.monotonic()
        last = max(self._kept.get(name, (_NEVER, None))[0], self._asked.get(name, _NEVER))
        if now - last < self.max_age_s:
            return False
        self._asked[name] = now
        return True

    def read(self, name: str, value: T, read_at: float | None = None) -> None:
        """``value`` as read at ``read_at`` (monotonic s; default now): give the time the read
        was sent when it rode on a round trip, so its age is never under-counted."""
        self._kept[name] = (time.monotonic() if read_at is None else read_at, value)

    def forget(self) -> None:
        """Drop every reading (a test that writes the values between runs of one process)."""
        self._kept.clear()
        self._asked.clear()
