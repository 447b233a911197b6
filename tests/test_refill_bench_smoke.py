"""The refill benchmark runs end to end (no timing assertions): one job claimed per refill, and
the round trips it prints are the merged path's three against the separate path's five."""

from __future__ import annotations

import io

import pytest

from bench.refill_bench import run


@pytest.mark.timeout(120)
def test_refill_bench_runs_and_counts_round_trips():
    out = io.StringIO()
    result = run(200, 2, out=out)
    assert result["merged claims per refill"] == result["separate claims per refill"] == 1.0
    assert result["merged round trips per refill"] == 3.0
    assert result["separate round trips per refill"] == 5.0
    assert "client CPU per refill ms" in out.getvalue()
