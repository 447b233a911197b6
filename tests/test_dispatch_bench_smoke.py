"""The dispatch benchmark's quick mode runs end to end (no timing assertions)."""

from __future__ import annotations

import io

import pytest

from bench.dispatch_bench import run


@pytest.mark.timeout(120)
def test_dispatch_bench_quick_mode_runs():
    out = io.StringIO()
    result = run(200, 60.0, None, out=out)
    text = out.getvalue()
    assert result["jobs"] == 600
    assert result["dispatched"] == 600  # every job of the period was due and published
    assert "plain send_task/apply_async loop" in text and "vs apply_async" in text
    assert result["bytes_per_job"] > 0
