"""Running a test's process with a skewed wall clock: libfaketime (Debian's ``faketime``, which
``.ci/run`` installs) and the ``time.sleep`` shim its monotonic bug needs (faketime_shim/).

``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves Celery's timers alone: only the wall clock lies.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "faketime_shim"
FAKETIME_LIBS = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))


def faked(skew: float, base: dict[str, str]) -> dict[str, str]:
    """What to add to ``base`` (a process environment) to run it ``skew`` s off the real wall
    clock: libfaketime, and the ``time.sleep`` shim its monotonic bug needs (faketime_shim)."""
    if not skew:
        return {}
    return {
        "LD_PRELOAD": FAKETIME_LIBS[0],
        "FAKETIME": f"{skew:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join([str(SHIM), base["PYTHONPATH"]]),
    }
