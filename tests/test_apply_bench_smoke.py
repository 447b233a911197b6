"""The checks-as-code benchmark runs end to end on 300 checks (no timing assertions): every
check is created once, applying the same file again writes nothing, and each figure it reports
(the budget's share, the batched against the one-at-a-time write rate) comes from its runs."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_apply_bench_creates_every_check_once_and_reports_its_rates():
    result = run_bench("apply_bench", "--checks", "300", "--sample", "50", timeout=120)
    assert result["checks"] == 300 and result["sample"] == 50
    assert result["first"]["created"] == 300
    assert result["again"]["created"] == result["again"]["updated"] == 0  # idempotent
    assert result["changed"]["updated"] == 3  # every 100th check
    assert result["json"]["created"] == 300
    assert 0 < result["first"]["write_s"] <= result["first"]["total_s"]
    assert result["budget_s"] == 60
    assert result["batched_rate"] == pytest.approx(300 / result["first"]["write_s"])
    assert result["single_rate"] > 0
    assert result["batched_vs_single"] == pytest.approx(
        result["batched_rate"] / result["single_rate"]
    )
