"""Pausing Python's cyclic garbage collector for a bulk step.

Why: a step that allocates many objects that all stay alive for its length (reading a checks
file of 50,000 checks, firing a cron window of 10,000 tasks) makes the cyclic collector scan the
growing heap again and again; reference counting alone frees what the step drops. Shared by the
check and the cron halves, so it lives below both.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a bulk step (reference counting still frees
    everything that is dropped); nests, and restores the previous state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
