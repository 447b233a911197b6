"""bench/precision_bench.py --repeat: N alternated rounds summarized as medians, and each ratio
taken within one round (never a median of one system over a median of the other), to each
anchor the round ran (:mod:`support.alternated_rounds`, which the bench imports)."""

from __future__ import annotations

import math

import pytest
from support.alternated_rounds import summarize
from support.benches import bench_process


def _pair(ours_cpu: float, plain_cpu: float, ours_p90: float, plain_p90: float) -> dict:
    return {
        "checkbeat": {"worker CPU per run ms": ours_cpu, "start late p90 ms": ours_p90},
        "plain": {"worker CPU per run ms": plain_cpu, "start late p90 ms": plain_p90},
    }


def test_medians_per_system_and_ratios_within_each_pair():
    pairs = [_pair(9.0, 9.0, 5.0, 4.0), _pair(10.0, 5.0, 30.0, 10.0), _pair(8.0, 10.0, 7.0, 7.0)]
    got = summarize(pairs)
    assert got["checkbeat"]["worker CPU per run ms"] == 9.0
    assert got["plain"]["worker CPU per run ms"] == 9.0
    # the pairs' ratios are 1.0, 2.0 and 0.8: median 1.0, whereas median/median would also be
    # 1.0 here but not for the p90 (7.0 / 7.0 = 1.0 against the pairs' 1.25, 3.0, 1.0)
    assert got["ratios"]["plain"]["worker CPU per run ms"] == (1.0, 0.8, 2.0)
    assert got["ratios"]["plain"]["start late p90 ms"] == (1.25, 1.0, 3.0)
    assert got["rounds"] == pairs


def test_each_anchor_gets_its_own_ratios_from_the_same_rounds():
    def kept(cpu: float, p90: float) -> dict:
        return {"kept": {"worker CPU per run ms": cpu, "start late p90 ms": p90}}

    rounds = [
        {**_pair(9.0, 6.0, 5.0, 4.0), **kept(9.0, 2.5)},
        {**_pair(8.0, 8.0, 6.0, 3.0), **kept(4.0, 6.0)},
    ]
    got = summarize(rounds)
    assert set(got["ratios"]) == {"plain", "kept"}
    assert got["ratios"]["plain"]["worker CPU per run ms"] == (1.25, 1.0, 1.5)
    assert got["ratios"]["kept"]["worker CPU per run ms"] == (1.5, 1.0, 2.0)
    assert got["ratios"]["kept"]["start late p90 ms"] == (1.5, 1.0, 2.0)
    assert got["kept"]["worker CPU per run ms"] == 6.5


def test_a_metric_plain_celery_has_no_value_for_has_no_ratio():
    pair = {"checkbeat": {"early starts": 0.0}, "plain": {"early starts": 0.0}}
    median, low, high = summarize([pair, pair])["ratios"]["plain"]["early starts"]
    assert math.isnan(median) and math.isnan(low) and math.isnan(high)


def test_one_pair_is_its_own_summary():
    pair = _pair(9.5, 7.6, 8.4, 5.2)
    got = summarize([pair])
    assert got["checkbeat"] == pair["checkbeat"] and got["plain"] == pair["plain"]
    assert got["ratios"]["plain"]["worker CPU per run ms"][0] == pytest.approx(9.5 / 7.6)


def test_repeat_below_one_is_refused_naming_the_option():
    done = bench_process("precision_bench", "--repeat", "0", timeout=60)
    assert done.returncode == 2
    assert "--repeat must be at least 1, not 0" in done.stderr
