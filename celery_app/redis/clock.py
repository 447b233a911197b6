"""Redis's clock: the one time authority for due, claim and lease decisions.

Why: beats and workers run on different machines whose wall clocks drift apart. A worker
behind beat that computed the next tick from its own clock stored a tick that was already
due (the check ran again at once); one ahead promoted and claimed work early, and wrote lease
expiries that beat's reaper then read on another clock. Every process that promotes, claims,
reaps or computes a next tick reads the server's ``TIME`` instead, so they all agree whatever
their own clocks say (docs/faults.md, "Clocks").
"""

from __future__ import annotations

from typing import Any


def server_time(client: Any) -> float:
    """The Redis server's time as Unix seconds (one ``TIME`` round trip)."""
    return from_time_reply(client.time())


def from_time_reply(reply: tuple[int, int] | list[int]) -> float:
    """Unix seconds from a ``TIME`` reply (seconds, microseconds), e.g. read in a pipeline."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000
