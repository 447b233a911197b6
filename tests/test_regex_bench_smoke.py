"""The regex benchmark runs end to end (no timing assertions): every case is searched by both
engines and re2's ratio to re is printed."""

from __future__ import annotations

import pytest

from bench.regex_bench import PATTERNS, main


@pytest.mark.timeout(120)
def test_regex_bench_prints_both_engines_and_the_ratio_per_case(capsys):
    assert main(["--runs", "5", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "re2 (probe)" in out and "re (stdlib)" in out
    assert out.count("x\n") == 2 * len(PATTERNS) + 1  # a ratio per case, and their median
    assert "re2, [ab]*a[ab]{250}c on 1 MiB" in out and "re, ^(a+)+$ on 25 bytes" in out
