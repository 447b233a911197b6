"""Running a test's process with a skewed wall clock: libfaketime (Debian's ``faketime``, which
``.ci/run`` installs) and the ``time.sleep`` shim its monotonic bug needs (faketime_shim/).

``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves Celery's timers alone: only the wall clock lies.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parent / "faketime_shim"
FAKETIME_LIBS = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
MISSING = "libfaketime is not installed (apt-get install faketime; .ci/run installs it)"


def needs_faketime() -> None:
    """Skip the test, saying why, where libfaketime is missing."""
    if not FAKETIME_LIBS:
        pytest.skip(MISSING)


def libfaketime(skew: float) -> dict[str, str]:
    """libfaketime's variables alone: the wall clock ``skew`` s off, the monotonic clock real;
    without the shim, so ``time.sleep`` fails as its monotonic bug makes it (faketime_shim)."""
    return {
        "LD_PRELOAD": FAKETIME_LIBS[0],
        "FAKETIME": f"{skew:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def faked(skew: float, base: dict[str, str]) -> dict[str, str]:
    """What to add to ``base`` (a process environment) to run it ``skew`` s off the real wall
    clock: libfaketime, and the ``time.sleep`` shim its monotonic bug needs (faketime_shim)."""
    if not skew:
        return {}
    return {
        **libfaketime(skew),
        "PYTHONPATH": os.pathsep.join([str(SHIM), base["PYTHONPATH"]]),
    }
