"""Alternated rounds of a side-by-side bench as one, and how a ratio is shown beside its range.

``bench/broker_bench.py`` and ``bench/scale_side_by_side.py`` run each system once a round,
alternating which goes first, then report each system's medians and the median of the rounds'
ratios, each ratio taken within one round: both systems of a round saw the same machine.
(``bench/precision_bench.py`` summarizes its rounds with ``tests/support/alternated_rounds.py``,
whose statistics a test pins.)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def median_figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One system's figures over the rounds: the median of every number, and of each command's
    calls per run (``commands``, most first; a command whose median is 0 is left out)."""
    merged: dict[str, Any] = {
        name: statistics.median(fig[name] for fig in runs)
        for name, value in runs[0].items()
        if isinstance(value, int | float)
    }
    names = dict.fromkeys(name for fig in runs for name in fig["commands"])
    medians = {n: statistics.median(fig["commands"].get(n, 0.0) for fig in runs) for n in names}
    merged["commands"] = {n: v for n, v in sorted(medians.items(), key=lambda kv: -kv[1]) if v > 0}
    return merged


def median_ratios(
    rounds: Sequence[Mapping[str, float]], names: Iterable[str]
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Each named ratio's median over the rounds, and its range (lowest, highest)."""
    names = list(names)
    medians = {n: statistics.median(r[n] for r in rounds) for n in names}
    ranges = {n: (min(r[n] for r in rounds), max(r[n] for r in rounds)) for n in names}
    return medians, ranges


def ratio_cell(
    ratios: Mapping[str, float], ranges: Mapping[str, Sequence[float]], name: str
) -> str:
    """The table cell of ratio ``name``: ``1.23x``, then its range where the rounds differ;
    empty for a figure that has no ratio."""
    cell = f"{ratios[name]:>8.2f}x" if name in ratios else ""
    span = ranges.get(name)
    if span and span[0] != span[1]:
        cell += f" ({span[0]:.2f}-{span[1]:.2f})"
    return cell
