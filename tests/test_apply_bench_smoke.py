"""The checks-as-code benchmark's quick mode runs end to end (no timing assertions)."""

from __future__ import annotations

import io

import pytest

from bench.apply_bench import run


@pytest.mark.timeout(120)
def test_apply_bench_quick_mode_runs():
    out = io.StringIO()
    result = run(300, 50, out=out)
    text = out.getvalue()
    assert result["first"]["created"] == 300
    assert result["again"]["created"] == result["again"]["updated"] == 0  # idempotent
    assert result["changed"]["updated"] == 3  # every 100th check
    assert result["json"]["created"] == 300
    assert "vs the 60 s budget" in text and "one create at a time" in text
