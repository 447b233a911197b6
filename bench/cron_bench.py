"""Cron ``next``: scheduling_core.cron side by side with croniter and cronsim, in one run.

Reproduce (from the repository root)::

    python -m bench.cron_bench            # full run, about two minutes
    python -m bench.cron_bench --quick    # smoke: runs in about a second (--json: the figures)

What is timed: each library parses the spec once, outside the timing; then one call answers "the
first firing strictly after 2026-01-01 00:00 UTC". croniter: ``set_current(start)`` then
``get_next(datetime)``; cronsim: reset the parsed iterator's ``dt`` to ``start`` then ``next()``
(cronsim iterates strictly after its start); ours: ``next(start + 1 minute)``, since ours is "the
earliest minute start >= t" -- the addition is inside the timed call. Each cell is the median
over repeats (timeit-style: ``number`` calls per repeat, auto-ranged to about 0.05 s per repeat in
the full run) in microseconds per call. ``agree`` says whether the three answers are equal.

Targets (issue #3), on the UTC table: every spec's median under 10 us; geometric-mean speed-up at
least 10x over croniter and 3x over cronsim; a spec that can never fire answers ``None`` in under
100 us. A second table runs the same specs from the same wall time in Europe/Berlin, through the
DST-aware path (ours) and each library's zone handling, for information.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cronsim
from croniter import croniter

from bench.figures import command_line
from scheduling_core.cron import parse

SPECS = [
    "* * * * *",
    "*/15 * * * *",
    "0 0 * * *",
    "0 0 1 * *",
    "0 0 29 2 *",
    "0 0 13 * 5",
    "5 4 * * 0",
    "0 9-17 * * 1-5",
    "0 0 30 2 1",
]
NEVER = ["0 0 30 2 *", "0 0 31 4,6,9,11 *"]
START = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Row:
    spec: str
    ours_us: float
    croniter_us: float
    cronsim_us: float
    ours: datetime | None
    croniter: datetime | None
    cronsim: datetime | None

    @property
    def agree(self) -> bool:
        return self.ours == self.croniter == self.cronsim


def median_us(call: Callable[[], object], quick: bool) -> float:
    timer = timeit.Timer(call)
    if quick:
        number, repeat = 50, 3
    else:
        number, _ = timer.autorange()  # >= 0.2 s; scale down to about 0.05 s per repeat
        number, repeat = max(1, number // 4), 9
    times = timer.repeat(repeat=repeat, number=number)
    return statistics.median(times) / number * 1e6


def bench_spec(spec: str, quick: bool, start: datetime = START) -> Row:
    ours = parse(spec)

    def call_ours() -> datetime | None:
        return ours.next(start + MINUTE)

    theirs = croniter(spec, start)

    def call_croniter() -> datetime:
        theirs.set_current(start, force=True)
        return theirs.get_next(datetime)

    sim = cronsim.CronSim(spec, start)
    initial = sim.dt  # cronsim keeps a naive wall time for fixed-time specs in DST zones

    def call_cronsim() -> datetime:
        sim.dt = initial
        return next(sim)

    return Row(
        spec=spec,
        ours_us=median_us(call_ours, quick),
        croniter_us=median_us(call_croniter, quick),
        cronsim_us=median_us(call_cronsim, quick),
        ours=call_ours(),
        croniter=call_croniter(),
        cronsim=call_cronsim(),
    )


def bench_never(spec: str, quick: bool) -> tuple[float, float, object]:
    """Ours on a spec that can never fire: (next us, parse+next us, answer)."""
    schedule = parse(spec)
    answer = schedule.next(START)
    next_us = median_us(lambda: schedule.next(START), quick)
    both_us = median_us(lambda: parse(spec).next(START), quick)
    return next_us, both_us, answer


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(rows: list[Row], out: Callable[[str], object]) -> tuple[float, float]:
    header = (
        f"{'spec':<16} {'ours':>7} {'croniter':>9} {'cronsim':>8} "
        f"{'x croniter':>10} {'x cronsim':>9}  agree  answer"
    )
    out(header)
    out("-" * len(header))
    for r in rows:
        out(
            f"{r.spec:<16} {r.ours_us:>7.2f} {r.croniter_us:>9.2f} {r.cronsim_us:>8.2f} "
            f"{r.croniter_us / r.ours_us:>10.1f} {r.cronsim_us / r.ours_us:>9.1f}  "
            f"{'yes' if r.agree else 'NO':<5}  {r.ours.isoformat() if r.ours else None}"
        )
    out("-" * len(header))
    over_croniter = geomean([r.croniter_us / r.ours_us for r in rows])
    over_cronsim = geomean([r.cronsim_us / r.ours_us for r in rows])
    out(
        f"geometric-mean speed-up: {over_croniter:.1f}x over croniter, "
        f"{over_cronsim:.1f}x over cronsim"
    )
    return over_croniter, over_cronsim


def figures(rows: list[Row], speed_ups: tuple[float, float]) -> dict[str, Any]:
    """One table's rows and geometric means, as data."""
    return {
        "rows": [
            {
                "spec": r.spec,
                "ours us": r.ours_us,
                "croniter us": r.croniter_us,
                "cronsim us": r.cronsim_us,
                "agree": r.agree,
                "answer": r.ours.isoformat() if r.ours else None,
            }
            for r in rows
        ],
        "x croniter": speed_ups[0],
        "x cronsim": speed_ups[1],
    }


def main(argv: list[str] | None = None, out: Callable[[str], object] = print) -> dict[str, Any]:
    """Print the tables; return their figures (the UTC table is the one the targets are
    about)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a one-second smoke run")
    quick = parser.parse_args(argv).quick
    rows = [bench_spec(spec, quick) for spec in SPECS]
    out(f"cron next() from {START.isoformat()} (strictly after), median us per call")
    out(f"python {sys.version.split()[0]}{'  [quick smoke: numbers are rough]' if quick else ''}")
    utc = table(rows, out)
    over_croniter, over_cronsim = utc
    slowest = max(rows, key=lambda r: r.ours_us)
    out(
        f"targets: >= 10x over croniter ({'met' if over_croniter >= 10 else 'MISSED'}), "
        f">= 3x over cronsim ({'met' if over_cronsim >= 3 else 'MISSED'}), every spec < 10 us "
        f"(slowest {slowest.spec!r} at {slowest.ours_us:.2f} us: "
        f"{'met' if slowest.ours_us < 10 else 'MISSED'})"
    )
    out("")
    berlin = START.replace(tzinfo=ZoneInfo("Europe/Berlin"))
    out(f"informational, no targets: the DST-aware path, from {berlin.isoformat()}")
    berlin_rows = [bench_spec(spec, quick, berlin) for spec in SPECS]
    result = {"utc": figures(rows, utc), "berlin": figures(berlin_rows, table(berlin_rows, out))}
    out("")
    out("never-matching specs (ours only: croniter loops to its limit, cronsim refuses at parse)")
    result["never"] = []
    for spec in NEVER:
        next_us, both_us, answer = bench_never(spec, quick)
        out(
            f"{spec:<18} next {next_us:6.2f} us, parse+next {both_us:6.2f} us -> {answer}"
            " (target < 100 us)"
        )
        result["never"].append(
            {"spec": spec, "next us": next_us, "parse+next us": both_us, "answer": answer}
        )
    return result


if __name__ == "__main__":
    command_line(main)
