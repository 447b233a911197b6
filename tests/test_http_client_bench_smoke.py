"""The http client benchmark runs end to end (no timing assertions): every system it compares
makes its GETs, and the probe's ratio to each other system is printed."""

from __future__ import annotations

import pytest

from bench.http_client_bench import main


@pytest.mark.timeout(120)
def test_http_client_bench_prints_each_system_and_the_probes_ratios(capsys):
    assert main(["--gets", "20", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for system in ("checkbeat http probe", "httpx, shared client", "http.client, new connection"):
        assert system in out
    assert out.count("checkbeat http probe / ") == 2
