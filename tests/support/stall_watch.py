"""A thread that notices when this process's other threads stop running: it wakes every few
milliseconds and records the longest gap between two wake-ups.

Why: a step that holds the GIL (a backtracking regex, a pure-Python codec) stalls every thread of
the process, which is every slot of a threads worker; a step that releases it (RE2, zlib, a
socket wait) stalls none. The longest gap tells which, measured on the code's own path.
"""

from __future__ import annotations

import threading
import time

TICK_S = 0.002


class StallWatch:
    """``with StallWatch() as watch: ...``; then ``watch.worst_gap_s``."""

    def __init__(self) -> None:
        self.worst_gap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            self.worst_gap_s = max(self.worst_gap_s, now - last)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
