"""The scale bench's quick mode runs end to end (no timing assertions): every check of the
period runs once through checkbeat's own claim, publish and post-exec, and every cron firing is
recorded."""

from __future__ import annotations

import pytest

from bench.scale_bench import main


@pytest.mark.timeout(120)
def test_scale_bench_quick_mode_counts_every_run_and_firing(capsys):
    result = main(["--quick"])
    text = capsys.readouterr().out
    assert result["checks"]["runs"] == 300  # every check of the period was claimed and run
    assert result["checks"]["state_commands_per_run"] > 0
    assert result["checks"]["consume_commands_per_message"] > 0  # kombu's delivery measured
    assert result["cron"]["firings"] == 100
    assert "one Redis core" in text and "cron path" in text
