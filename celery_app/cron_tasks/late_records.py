"""The ends of cron runs that could not be recorded because Redis was away, written once it is
back.

The end of a run releases its window's in-flight key. Lost, that key holds every later window
of a ``skip`` singleton until its TTL, which is the window's grace plus the task's hard limit
(over five minutes by default): a Redis restart during one run would cost the task that many
windows. So a worker keeps an end it could not write and writes it from a daemon thread, with a
backoff capped at :data:`MAX_PAUSE_S`, as soon as Redis answers again. The record carries the
run's own end time, and ``cron_finish.lua`` releases the key only if it still names this run's
window, so a late write cannot free a later run's key.

Only Redis being away defers a record; any other error is logged and dropped, as before. The
records live in the worker process: one that exits before Redis is back loses them (the key's
TTL still bounds the hold), and at most :data:`MAX_PENDING` wait, the oldest dropped first.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from redis.backoff import ExponentialBackoff

from celery_app.redis.client import FAILOVER_ERRORS

log = logging.getLogger(__name__)

#: Errors that mean Redis is away (down, failing over, read-only replica): worth writing later.
AWAY_ERRORS: tuple[type[BaseException], ...] = tuple(FAILOVER_ERRORS)
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0
#: The pause after the n-th failed attempt in a row: 0.25 s, 0.5 s, 1 s, ... up to 5 s.
BACKOFF = ExponentialBackoff(cap=MAX_PAUSE_S, base=FIRST_PAUSE_S)
#: A record not written within this long is dropped: the in-flight key it would release has
#: expired long before, and the run's outcome is history by then.
GIVE_UP_S = 3600.0
MAX_PENDING = 10_000


@dataclass(frozen=True)
class LateRecord:
    what: str  # for the log: "the end of <task> (<tenant>, <window>)"
    write: Callable[[], object]
    since: float  # monotonic time of the first failed attempt


class LateRecords:
    """Records waiting for Redis, and the thread that writes them (started on first use, in
    the process that uses it: a forked pool child starts its own)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pending: deque[LateRecord] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def write_or_keep(self, what: str, write: Callable[[], object]) -> bool:
        """Write now; if Redis is away, keep the record for the thread and return False."""
        try:
            write()
            return True
        except AWAY_ERRORS as exc:
            self._keep(LateRecord(what, write, self._clock()), exc)
            return False

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _keep(self, record: LateRecord, exc: BaseException) -> None:
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                dropped = self._pending.popleft()
                log.error("cron: dropped %s: %d records already wait for Redis", dropped.what,
                          MAX_PENDING)  # fmt: skip
            self._pending.append(record)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="checkbeat-late-cron-records", daemon=True
                )
                self._thread.start()
        log.warning("cron: could not record %s (%s); it is written when Redis is back",
                    record.what, exc)  # fmt: skip

    def _run(self) -> None:
        # Attempts failed in a row: the record that started this thread just failed its write.
        # A record kept during a pause failed its own write too, so nothing cuts a pause short.
        failures = 1
        while True:
            if failures:
                time.sleep(BACKOFF.compute(failures - 1))
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                record = self._pending[0]
            try:
                record.write()
            except AWAY_ERRORS:
                if self._clock() - record.since > GIVE_UP_S:
                    self._drop(record, f"Redis was away for over {GIVE_UP_S:.0f}s")
                failures += 1
                continue
            except Exception as exc:
                self._drop(record, f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self._pending.popleft()
            log.info("cron: recorded %s now that Redis is back", record.what)
            failures = 0

    def _drop(self, record: LateRecord, why: str) -> None:
        with self._lock:
            if self._pending and self._pending[0] is record:
                self._pending.popleft()
        log.error("cron: dropped %s: %s", record.what, why)

    def _forget_after_fork(self) -> None:
        """A forked child starts empty: the parent's thread writes the parent's records."""
        self._pending = deque()
        self._lock = threading.Lock()
        self._thread = None


#: The worker process's records (each pool child has its own after the fork).
late_records = LateRecords()
os.register_at_fork(after_in_child=late_records._forget_after_fork)
