"""The uptime report benchmark's quick mode runs end to end (no timing bars): 500 checks'
month by day in one pass of two round trips, each single-check report in two."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_uptime_bench_quick_mode_reports_every_check_in_two_round_trips():
    result = run_bench("uptime_bench", "--quick", timeout=120)
    assert result["checks"] == 500 and result["buckets"] == 30  # November's days
    assert result["total_round_trips"] == 2  # the checks' reads, then their windows
    assert result["single_round_trips"] == 2.0
    assert result["total_s"] > 0 and result["per_check_ms"] > 0
    assert 0 < result["single_p50_ms"] <= result["single_p99_ms"]
    # the generated month has incidents, capped streams and is mostly up
    assert result["incidents"] > 0 and result["trimmed"] > 0
    assert 90 < result["mean_uptime_pct"] < 100
