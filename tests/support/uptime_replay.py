"""The brute-force side of the uptime report tests: a minute-by-minute walk of a range whose
minutes are already classified (each one's state, None for no data, and whether a maintenance
window covers it), giving what ``scheduling_core.uptime.account`` must give for it.

Shared by the pure property test (tests/test_uptime_core.py) and the one through Redis
(tests/test_uptime_replay.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling_core.health import State

MIN = 60


def brute_totals(minutes: Mapping[int, tuple[State | None, bool]], start: int, end: int):
    """({category: seconds}, (incidents, longest, recovered, recovery_total)) of minutes
    [start, end); ``minutes`` must also hold ``end`` (a recovery exactly at the range's end)."""
    t = dict.fromkeys(["up", "degraded", "down", "maintenance", "no_data"], 0)
    incidents, longest, recovered, recovery_total = 0, 0, 0, 0
    run = None  # counted seconds of the down period being walked
    for m in range(start, end + 1):
        state, window = minutes[m]
        if m < end:
            if state is None:
                t["no_data"] += MIN
            elif window:
                t["maintenance"] += MIN
            else:
                t[str(state)] += MIN
        if state == State.DOWN and m < end:
            run = (run or 0) + (0 if window else MIN)
            continue
        if run is not None:
            if run > 0:
                incidents += 1
                longest = max(longest, run)
                if state not in (None, State.DOWN):  # recovered at m: known, not down
                    recovered += 1
                    recovery_total += run
            run = None
    return t, (incidents, longest, recovered, recovery_total)


def assert_same(totals, brute) -> None:
    """``totals`` (a scheduling_core.uptime.Totals) is what the walk found."""
    t, (incidents, longest, recovered, recovery_total) = brute
    got = {
        "up": totals.up,
        "degraded": totals.degraded,
        "down": totals.down,
        "maintenance": totals.maintenance,
        "no_data": totals.no_data,
    }
    assert got == t
    assert (
        totals.incidents,
        totals.longest_incident,
        totals.recovered,
        totals.recovery_total,
    ) == (incidents, longest, recovered, recovery_total)
