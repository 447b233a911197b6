"""bench/beat_bench.py --quick runs end to end (its own redis-server; no timings asserted):
every scheduler fires its whole window, and each rate is compared with checkbeat's steady one."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_beat_bench_quick_mode_fires_every_window_and_compares_each_scheduler():
    got = run_bench("beat_bench", "--quick", timeout=120)
    schedulers = got["schedulers"]
    assert set(schedulers) == {
        "checkbeat CronEngine, steady window",
        "checkbeat CronEngine, first window*",
        "checkbeat CronEngine, mixed sources",
        "celery-redbeat RedBeatScheduler",
        "Celery PersistentScheduler",
    }
    steady = schedulers["checkbeat CronEngine, steady window"]
    quick_entries = {"celery-redbeat RedBeatScheduler": 50, "Celery PersistentScheduler": 10}
    for name, row in schedulers.items():
        assert row["fired"] == quick_entries.get(name, 300), name
        assert row["seconds"] > 0, name
        assert row["fired per s"] == pytest.approx(row["fired"] / row["seconds"]), name
        assert row["vs checkbeat"] == pytest.approx(row["fired per s"] / steady["fired per s"])
    assert steady["vs checkbeat"] == 1.0
    assert got["quiet tick"]["tasks"] == 300
    assert got["quiet tick"]["mean us"] > 0 and got["quiet tick"]["p99 us"] > 0
