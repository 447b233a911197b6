"""Smoke test of bench/precision_bench.py in quick mode: every system runs and reports.

Timings are the bench's business; this checks the harness works end to end (real redis-server,
real beat, real workers, real HTTP target) and that no check started before its tick.
"""

from __future__ import annotations

import pytest

from bench import precision_bench


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_precision_bench_runs_every_system_and_never_starts_early(capsys):
    rows = precision_bench.main(["--quick", "--anchor", "plain", "--anchor", "kept"])["quick"]
    for system in ("checkbeat", "plain", "kept"):
        row = rows[system]
        assert row["runs"] >= precision_bench.QUICK.checks, system
        assert row["early starts"] == 0, system
        assert row["worker CPU per run ms"] > 0, system
    out = capsys.readouterr().out
    assert "start late p99 ms" in out and "plain Celery" in out and "plain + state" in out
