"""Smoke test of bench/overload_bench.py in quick mode: every system runs and reports.

Timings are the bench's business, not this test's: it checks the harness works end to end
(real redis-server, real HTTP target, real workers for the three systems), and that the figures
it reports come from those runs.
"""

from __future__ import annotations

import math

import pytest
from support.benches import run_bench

SYSTEMS = ("(a) celery 1 queue", "(b) celery 2 queues", "(c) checkbeat")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_overload_bench_runs_all_three_systems():
    got = run_bench("overload_bench", "--quick", timeout=170)
    workload, rows = got["workload"], got["systems"]
    assert tuple(rows) == SYSTEMS
    for name, row in rows.items():
        # every fast and slow check ran at least once in every system
        assert row["fast runs completed"] >= workload["fast"], name
        assert row["slow runs completed"] >= workload["slow"], name
        # the broker depth was sampled over the run, and the row's maximum is the samples'
        assert got["broker depth"][name], name
        assert row["broker depth max"] == max(got["broker depth"][name]), name
    ours = rows["(c) checkbeat"]
    assert ours["broker depth max"] <= workload["pool"]
    assert set(got["vs (c)"]) == set(SYSTEMS[:2])
    for name, ratios in got["vs (c)"].items():
        assert set(ratios) == set(ours), name
        for metric, ratio in ratios.items():
            if ours[metric] and not math.isnan(ours[metric]):
                expected = pytest.approx(rows[name][metric] / ours[metric], nan_ok=True)
                assert ratio == expected, (name, metric)
            else:
                assert math.isnan(ratio), (name, metric)
