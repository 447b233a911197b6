"""Redis's clock: the one time authority for due, claim and lease decisions.

Why: beats and workers run on different machines whose wall clocks drift apart. A worker
behind beat that computed the next tick from its own clock stored a tick that was already
due (the check ran again at once); one ahead promoted and claimed work early, and wrote lease
expiries that beat's reaper then read on another clock. Every process that promotes, claims,
reaps or computes a next tick reads the server's ``TIME`` instead, so they all agree whatever
their own clocks say (docs/faults.md, "Clocks").
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

#: How long a process advances one reading of the server's clock by its own monotonic clock
#: before it reads ``TIME`` again. Why not longer: after a failover the new master's clock may
#: differ from the old one's by what NTP leaves between two machines, and a process follows it
#: within this long. Why not every call: a run's start would pay a command for it.
CLOCK_REFRESH_S = 10.0


def server_time(client: Any) -> float:
    """The Redis server's time as Unix seconds (one ``TIME`` round trip)."""
    return from_time_reply(client.time())


def from_time_reply(reply: tuple[int, int] | list[int]) -> float:
    """Unix seconds from a ``TIME`` reply (seconds, microseconds), e.g. read in a pipeline."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000


@dataclass(frozen=True, slots=True)
class _Reading:
    server: float  # the server's Unix s, at the latest ...
    at: float  # ... at this time.perf_counter(): when the TIME reply was received


class ServerClock:
    """Redis's time without a round trip per call: one ``TIME`` reading per client, advanced
    by this process's monotonic clock (which a skewed or stepped wall clock does not move) and
    read again after ``refresh_s``.

    It never runs ahead of the server: a reading is dated when its reply arrives, and the
    server wrote the time before that, so a run that waits for its tick on this clock never
    starts early (``scheduling_core.on_tick.tick_wait``). It is behind by the reply's way back
    plus the monotonic clock's drift over ``refresh_s`` (parts per million): well under a
    millisecond on a LAN. Not the middle of the round trip: a ``TIME`` held up on its way in
    (a busy server, a new connection, a thread that lost the CPU) would put that ahead by half
    the hold.

    Why: a check run's start read needs the server's time (its tick, its next tick, a handed
    lease's expiry), and so does every tick of beat's dispatcher (what is due, which leases
    lapsed); a ``TIME`` for each cost a command and, for a tick, a round trip of its own."""

    def __init__(self, refresh_s: float = CLOCK_REFRESH_S) -> None:
        self._refresh_s = refresh_s
        # per client object, and gone with it (a client for another server starts afresh)
        self._readings: weakref.WeakKeyDictionary[Any, _Reading] = weakref.WeakKeyDictionary()

    def now(self, client: Any) -> float:
        """The server's time now (Unix s), reading ``TIME`` when the last reading is older than
        the refresh interval. Threads may race to read it again: each reading is as good."""
        reading = self._readings.get(client)
        at = time.perf_counter()
        if reading is None or at - reading.at > self._refresh_s:
            server = server_time(client)
            reading = _Reading(server, time.perf_counter())
            self._readings[client] = reading
            return server
        return reading.server + (at - reading.at)


#: The process's clock of each Redis it talks to (perf_counter is system-wide: a forked child
#: keeps its parent's readings valid).
SERVER_CLOCK = ServerClock()
