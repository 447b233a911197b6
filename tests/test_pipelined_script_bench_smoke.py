"""The pipelined-script benchmark runs end to end (no timing assertions): redis-py's way sends
a SCRIPT EXISTS per pipeline, checkbeat's none."""

from __future__ import annotations

import io

import pytest

from bench.pipelined_script_bench import run


@pytest.mark.timeout(60)
def test_pipelined_script_bench_runs_and_counts_script_commands():
    out = io.StringIO()
    result = run(50, out=out)
    assert result["pipelines"] == 50
    assert result["SCRIPT commands per pipeline"] == (0.0, 1.0)
    assert "client CPU per pipeline us" in out.getvalue()
