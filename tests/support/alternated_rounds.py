"""N alternated rounds of a bench as one summary: each system's medians, and checkbeat's ratio
to each other system taken within each round (``bench/precision_bench.py --repeat``).

Why here: the bench summarizes its rounds with it and ``tests/test_precision_summary.py`` pins
its statistics on made-up rounds; a bench may import ``tests/support``, a test never ``bench/``.
Why within a round: on a shared machine both systems of one round see the same load, so a
median of per-round ratios is steadier than a median over a median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs``; NaN where either is NaN or ``theirs`` is 0 (no ratio to show)."""
    return ours / theirs if theirs and theirs == theirs and ours == ours else float("nan")


def summarize(rounds: Sequence[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """N rounds of rows (``{"checkbeat": row, "plain": row, ...}``, one per alternated round)
    as one: each system's row of medians, checkbeat's ratios to each other system per metric
    (``ratios[system][metric]``: median, lowest, highest; each ratio from one round) and the
    rounds themselves."""
    metrics = list(rounds[0]["checkbeat"])
    systems = list(rounds[0])
    nan = float("nan")
    out: dict[str, Any] = {"rounds": list(rounds), "ratios": {}}
    for system in systems:
        out[system] = {m: statistics.median(r[system][m] for r in rounds) for m in metrics}
    for system in systems[1:]:
        out["ratios"][system] = {}
        for m in metrics:
            got = [ratio(r["checkbeat"][m], r[system][m]) for r in rounds]
            ratios = [x for x in got if x == x]
            out["ratios"][system][m] = (
                (statistics.median(ratios), min(ratios), max(ratios)) if ratios else (nan,) * 3
            )
    return out
