"""A loop in a daemon thread whose error surfaces where the caller stops it.

A thread's exception is otherwise lost (printed, never raised): a dispatcher ticking for a test,
or a bench's publisher, that failed would leave the caller measuring or asserting on nothing.
The test helpers (``workers.Ticker``) and the benches' feeds (``bench/broker_bench.py``,
``bench/scale_side_by_side.py``) build on this.
"""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """:meth:`_run` (a subclass's loop, which waits on :attr:`_stop` rather than sleeping past
    it) in a daemon thread from :meth:`start`; :meth:`stop` sets :attr:`_stop`, joins the
    thread and raises what :meth:`_run` raised, if anything."""

    def __init__(self, name: str, join_s: float = 10.0) -> None:
        self.error: BaseException | None = None
        self._join_s = join_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # raised again by stop()
            self.error = exc

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._join_s)
        if self.error is not None:
            raise self.error
