"""Loaded only by the clock-skew test's skewed processes (this directory is on their PYTHONPATH).

libfaketime 0.9.10 (Debian 12) with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` breaks
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which ``time.sleep`` uses since Python
3.11: every sleep fails with EINVAL (wolfcw/libfaketime#426). Without that variable the monotonic
clock is faked and ``pthread_cond_timedwait`` on it hangs instead (wolfcw/libfaketime#390), so
``threading.Event.wait`` never returns. This keeps the variable and sleeps with ``select``,
which libfaketime leaves alone: only the wall clock lies, as on a machine whose clock is off.
"""

from __future__ import annotations

import os
import select
import time

if "faketime" in os.environ.get("LD_PRELOAD", ""):

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = _sleep
