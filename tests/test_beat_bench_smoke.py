"""bench/beat_bench.py --quick runs end to end (its own redis-server; no timings asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_beat_bench_quick_mode_prints_the_table():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "bench.beat_bench", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = ("checkbeat CronEngine", "mixed sources", "celery-redbeat", "PersistentScheduler")
    for row in (*rows, "quiet tick"):
        assert row in result.stdout
