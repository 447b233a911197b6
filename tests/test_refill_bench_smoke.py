"""The refill benchmark runs end to end (no timing assertions): one job claimed per refill, and
the round trips it counts are the merged path's three against the separate path's five."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_refill_bench_runs_and_counts_round_trips():
    result = run_bench("refill_bench", "--checks", "200", "--blocks", "2", timeout=120)
    assert result["merged claims per refill"] == result["separate claims per refill"] == 1.0
    assert result["merged round trips per refill"] == 3.0
    assert result["separate round trips per refill"] == 5.0
    # the 200 ticks in 2 x 2 alternated blocks of 50: 100 refills per path
    assert result["merged refills"] == result["separate refills"] == 100
    assert result["merged client CPU per refill ms"] > 0
    assert result["separate client CPU per refill ms"] > 0
