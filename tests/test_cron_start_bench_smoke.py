"""Smoke test of bench/cron_start_bench.py in quick mode: real beat and worker fire every-second
windows, each run is measured against its window, and none starts before its window; with
--profile every stage is stamped, and beat fires each window before its start (the lead)."""

from __future__ import annotations

import pytest

from bench import cron_start_bench


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_cron_start_bench_measures_runs_and_none_starts_early(capsys):
    row = cron_start_bench.main(["--quick", "--entries", "2", "--profile"])
    assert row["runs"] >= 4
    assert row["early starts"] == 0
    assert "task body start" in capsys.readouterr().out
    for stage in cron_start_bench.STAGES:
        assert row[f"{stage} p50 ms"] == row[f"{stage} p50 ms"], stage  # measured, not NaN
    assert row["beat woke p99 ms"] < 0  # every window was fired ahead of its start
