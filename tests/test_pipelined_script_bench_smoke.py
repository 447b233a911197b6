"""The pipelined-script benchmark runs end to end (no timing assertions): redis-py's way sends
a SCRIPT EXISTS per pipeline, checkbeat's none."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_pipelined_script_bench_runs_and_counts_script_commands():
    result = run_bench("pipelined_script_bench", "--pipelines", "50", timeout=60)
    assert result["pipelines"] == 50
    # (checkbeat, redis-py Script)
    assert result["SCRIPT commands per pipeline"] == [0.0, 1.0]
    ours, theirs = result["client CPU per pipeline us"]
    assert ours > 0 and theirs > 0
