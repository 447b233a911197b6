"""Smoke test of bench/cron_start_bench.py in quick mode: real beat and worker fire every-second
windows, each run is measured against its window, and none starts before its window; with
--profile every stage is stamped, and beat fires each window before its start (the lead)."""

from __future__ import annotations

import math

import pytest
from support.benches import run_bench

STAGES = (
    "beat woke",
    "claim",
    "publish",
    "broker to worker",
    "worker to prerun",
    "prerun to body",
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_cron_start_bench_measures_runs_and_none_starts_early():
    row = run_bench("cron_start_bench", "--quick", "--entries", "2", "--profile", timeout=110)
    assert row["runs"] >= 4
    assert row["early starts"] == 0
    assert 0 <= row["start late p50 ms"] <= row["start late p99 ms"] <= row["start late max ms"]
    assert {key.rsplit(" p", 1)[0] for key in row if key.endswith(" p50 ms")} == {
        "start late",
        *STAGES,
    }
    for stage in STAGES:
        assert not math.isnan(row[f"{stage} p50 ms"]), stage  # measured
    assert row["beat woke p99 ms"] < 0  # every window was fired ahead of its start
