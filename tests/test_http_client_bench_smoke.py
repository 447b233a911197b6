"""The http client benchmark runs end to end (no timing assertions): every system it compares
makes its GETs, and the probe's ratio to each other system comes from the same rounds."""

from __future__ import annotations

import statistics

import pytest
from support.benches import run_bench

SYSTEMS = ("checkbeat http probe", "httpx, shared client", "http.client, new connection")


@pytest.mark.slow
def test_http_client_bench_measures_each_system_and_the_probes_ratios():
    result = run_bench("http_client_bench", "--gets", "20", "--rounds", "1", timeout=120)
    assert result["gets"] == 20
    cpu = result["cpu ms per GET"]
    assert tuple(cpu) == SYSTEMS
    for system, rounds in cpu.items():
        assert len(rounds) == 1 and rounds[0] > 0, system  # the warm-up round is not counted
    ours = statistics.median(cpu[SYSTEMS[0]])
    ratios = result["checkbeat http probe / system"]
    assert set(ratios) == set(SYSTEMS[1:])
    for system, ratio in ratios.items():
        assert ratio == pytest.approx(ours / statistics.median(cpu[system])), system
