"""bench/cron_bench.py --quick runs end to end (no timing assertions): the three libraries give
the same answer for every spec, from UTC and from Europe/Berlin, each speed-up is the geometric
mean of that table's rows, and a spec that can never fire answers None."""

from __future__ import annotations

import math

import pytest
from support.benches import run_bench


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


@pytest.mark.slow
def test_cron_bench_quick_mode_the_three_libraries_agree():
    got = run_bench("cron_bench", "--quick", timeout=120)
    utc, berlin = got["utc"], got["berlin"]
    specs = [row["spec"] for row in utc["rows"]]
    assert len(specs) == 9 and [row["spec"] for row in berlin["rows"]] == specs
    for table in (utc, berlin):
        disagreements = [row["spec"] for row in table["rows"] if not row["agree"]]
        assert not disagreements, disagreements
        for other in ("croniter", "cronsim"):
            ratios = [row[f"{other} us"] / row["ours us"] for row in table["rows"]]
            assert table[f"x {other}"] == pytest.approx(_geomean(ratios)), other
    assert all(row["answer"] is not None for row in utc["rows"])
    assert [n["spec"] for n in got["never"]] == ["0 0 30 2 *", "0 0 31 4,6,9,11 *"]
    assert all(n["answer"] is None for n in got["never"])
