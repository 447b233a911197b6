"""Smoke test of bench/precision_bench.py in quick mode: every system runs and reports.

Timings are the bench's business; this checks the harness works end to end (real redis-server,
real beat, real workers, real HTTP target), that no check started before its tick, and that
checkbeat's ratio to each anchor is taken from the same round's two rows.
"""

from __future__ import annotations

import pytest
from support.benches import run_bench

METRIC = "worker CPU per run ms"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_precision_bench_runs_every_system_and_never_starts_early():
    args = ("--quick", "--anchor", "plain", "--anchor", "kept")
    got = run_bench("precision_bench", *args, timeout=170)
    quick = got["quick"]
    (round_,) = quick["rounds"]
    assert set(round_) == {"checkbeat", "plain", "kept"}
    for system, row in round_.items():
        assert row["runs"] >= quick["load"]["checks"], system
        assert row["early starts"] == 0, system
        assert row[METRIC] > 0, system
        assert 0 <= row["start late p50 ms"] <= row["start late p99 ms"], system
        assert quick[system][METRIC] == row[METRIC], system  # one round is its own median
    for anchor in ("plain", "kept"):
        expected = round_["checkbeat"][METRIC] / round_[anchor][METRIC]
        assert quick["ratios"][anchor][METRIC] == [pytest.approx(expected)] * 3, anchor
