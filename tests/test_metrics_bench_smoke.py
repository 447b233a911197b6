"""The per-check exporter benchmark's quick mode runs end to end (no timing assertions)."""

from __future__ import annotations

import io

import pytest

from bench.metrics_bench import run


@pytest.mark.timeout(120)
def test_metrics_bench_quick_mode_runs():
    out = io.StringIO()
    result = run(2_000, out=out)
    text = out.getvalue()
    assert result["pages"] == 2
    assert "capped page 0 (1,000 checks)" in text and "capped page 1 (1,000 checks)" in text
    assert "cap raised x10" in text and "worst capped page" in text and "uid list read" in text
