"""The dispatch benchmark runs end to end on 200 checks (no timing assertions): every job of
the period is due and published, and each publishing path is compared with plain apply_async on
the same messages."""

from __future__ import annotations

import pytest
from support.benches import run_bench

PATHS = (
    "plain send_task/apply_async loop",
    "kombu Producer.batch + send_task_message",
    "make_publisher: Redis fast path (publish only)",
    "dispatcher: promote + claim + publish",
)


@pytest.mark.slow
def test_dispatch_bench_publishes_every_due_job_and_compares_each_path():
    result = run_bench(
        "dispatch_bench", "--checks", "200", "--window", "60", "--profile", timeout=120
    )
    assert result["jobs"] == 600
    assert result["dispatched"] == 600  # every job of the period was due and published
    assert result["bytes_per_job"] > 0
    paths = result["paths"]
    assert tuple(paths) == PATHS
    for name, path in paths.items():
        assert path["messages"] == 600, name  # no --baseline-max: every message, every path
        assert path["msg per s"] == pytest.approx(600 / path["seconds"]), name
        assert path["vs apply_async"] == pytest.approx(
            path["msg per s"] / result["apply_async_rate"]
        )
    assert paths[PATHS[0]]["vs apply_async"] == 1.0
    # where the tick's time went: each step's CPU here and in the redis-server, and a profile
    assert set(result["cpu_ms"]) == {"promote", "claim", "publish"}
    assert all(ms["python"] >= 0 and ms["redis"] >= 0 for ms in result["cpu_ms"].values())
    assert result["cpu_ms"]["publish"]["python"] > 0
    spent_s = sum(ms["python"] + ms["redis"] for ms in result["cpu_ms"].values()) / 1000
    assert result["jobs_per_cpu_s"] == pytest.approx(600 / spent_s)
    assert (
        "function calls" in result["profile"] and "Ordered by: internal time" in (result["profile"])
    )
