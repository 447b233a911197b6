"""The scale bench's quick mode runs end to end (no timing assertions): every check of the
period runs once through checkbeat's own claim, publish and post-exec, and every cron firing is
recorded."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_scale_bench_quick_mode_counts_every_run_and_firing():
    result = run_bench("scale_bench", "--quick", timeout=120)
    checks, cron = result["checks"], result["cron"]
    assert checks["runs"] == 300  # every check of the period was claimed and run
    assert checks["state_commands_per_run"] > 0
    assert checks["broker_commands_per_run"] > 1  # a BRPOP per delivery, and the publishes
    assert checks["runs_per_redis_core_s"] > 0  # what one Redis core sustains
    assert cron["firings"] == 100  # 50 tasks x 2 windows
    assert cron["state_commands_per_firing"] > 0 and cron["publish_commands_per_firing"] > 0
