"""Smoke test of bench/overload_bench.py in quick mode: every system runs and reports.

Timings are the bench's business, not this test's: it checks the harness works end to end
(real redis-server, real HTTP target, real workers for the three systems).
"""

from __future__ import annotations

import pytest

from bench import overload_bench


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_overload_bench_runs_all_three_systems(capsys):
    rows = overload_bench.main(["--quick"])
    assert set(rows) == {"(a) celery 1 queue", "(b) celery 2 queues", "(c) checkbeat"}
    for name, row in rows.items():
        # every fast and slow check ran at least once in every system
        assert row["fast runs completed"] >= overload_bench.QUICK.fast, name
        assert row["slow runs completed"] >= overload_bench.QUICK.slow, name
    assert rows["(c) checkbeat"]["broker depth max"] <= overload_bench.QUICK.pool
    out = capsys.readouterr().out
    assert "broker depth over time" in out and "(a)/(c)" in out
