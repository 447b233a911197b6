"""Run calls in threads released by one barrier: concurrent claims, refills, ticks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def at_once(calls: Sequence[Callable[[], Any]], timeout: float = 30.0) -> list[Any]:
    """Each call's result, in order; the calls start together, and any error is raised."""
    got: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(calls))

    def run(k: int) -> None:
        try:
            barrier.wait(10)
            got[k] = calls[k]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return got
