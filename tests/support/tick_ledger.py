"""Runs per tick, counted from what a probe target received, against the ticks that were due.

Why from the target: the results history is written by the same Redis a failover may cut
short, so it cannot be the witness of what ran; the target's hits are. Each hit is given the
tick it served: the run record whose probe spans it (the latest to start, when two do) names
its ``scheduled_at`` (a late run serves an earlier tick than the window it lands in); a hit no
record spans (its completion was lost) serves the tick of the window it arrived in. A tick due
and not served is accounted for when a record names it (a lost run the reaper recorded) or a
job counter counts it (abandoned, skipped by a rate limit, passed over by a run that ended
late); anything else is an unreported loss.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: How far outside a record's [started_at, finished_at] a hit may arrive and still be its probe
#: (the worker's and the target's clocks are this host's; the slack covers the request's way).
SPAN_SLACK_S = 0.05


def _unix(value: float | str) -> float:
    """A record's instant: ISO 8601 as run records store it, or Unix s."""
    return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else value


@dataclass
class TickLedger:
    """One job's ticks (phase-aligned Unix seconds, every ``period_s``) from ``first`` to
    ``last`` (both tick seconds, inclusive)."""

    period_s: int
    phase_s: int  # the tick second modulo the period
    first: float
    last: float
    served: Counter[int] = field(default_factory=Counter)  # tick index -> hits
    recorded: set[int] = field(default_factory=set)  # tick indexes a run record names
    lost_records: int = 0  # records of runs that did not probe (reaped), within the window

    def index(self, instant: float) -> int:
        """The tick whose window (its second, up to the next tick) holds ``instant``."""
        return math.floor((instant - self.phase_s) / self.period_s)

    def due(self) -> range:
        return range(
            math.ceil((self.first - self.phase_s) / self.period_s), self.index(self.last) + 1
        )

    def count(self, hits: Iterable[float], records: Iterable[Mapping[str, Any]]) -> TickLedger:
        spans = []
        for record in records:
            scheduled = record.get("scheduled_at")
            if scheduled is None:
                continue
            tick = self.index(_unix(scheduled))
            self.recorded.add(tick)
            started = record.get("started_at")
            if started is None:
                if tick in self.due():
                    self.lost_records += 1
                continue
            spans.append(
                (
                    _unix(started) - SPAN_SLACK_S,
                    _unix(record["finished_at"]) + SPAN_SLACK_S,
                    tick,
                )
            )
        for hit in hits:
            # back-to-back runs overlap within the slack: the one that started last is the hit's
            spanning = [(lo, t) for lo, hi, t in spans if lo <= hit <= hi]
            tick = max(spanning)[1] if spanning else self.index(hit)
            self.served[tick] += 1
        return self

    def twice(self) -> list[int]:
        """Ticks due that were probed more than once."""
        return [t for t in self.due() if self.served[t] > 1]

    def missed(self) -> list[int]:
        """Ticks due that were not probed."""
        return [t for t in self.due() if self.served[t] == 0]

    def unrecorded_misses(self) -> list[int]:
        """Missed ticks no run record names."""
        return [t for t in self.missed() if t not in self.recorded]

    def describe(self) -> str:
        """What was measured, for a failure message or the log."""
        due = self.due()
        return (
            f"{len(due)} ticks due, {sum(self.served[t] > 0 for t in due)} probed, "
            f"{len(self.twice())} twice, {len(self.missed())} missed (lost records "
            f"{self.lost_records}, named by no record "
            f"{[self.tick_second(t) for t in self.unrecorded_misses()]})"
        )

    def tick_second(self, index: int) -> int:
        return index * self.period_s + self.phase_s
