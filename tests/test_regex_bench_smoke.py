"""The regex benchmark runs end to end (no timing assertions): every case is searched by both
engines, and the ratio is computed from both engines' figures of the same run."""

from __future__ import annotations

import statistics

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_regex_bench_measures_both_engines_and_the_ratio_per_case():
    result = run_bench("regex_bench", "--runs", "5", "--rounds", "1", timeout=120)
    re2 = {k.removesuffix(" re2 us"): v for k, v in result.items() if k.endswith(" re2 us")}
    re = {k.removesuffix(" re us"): v for k, v in result.items() if k.endswith(" re us")}
    assert re2.keys() == re.keys() and len(re2) == result["cases"] >= 10
    assert all(v > 0 for v in (*re2.values(), *re.values()))
    median = statistics.median(re2[case] / re[case] for case in re2)
    assert result["re2 / re median"] == pytest.approx(median)
    # the long searches ran: re2 over 1 MiB, re's backtracking on 25 bytes
    assert result["re2, [ab]*a[ab]{250}c on 1 MiB took ms"] > 0
    assert result["re, ^(a+)+$ on 25 bytes took ms"] > 0
