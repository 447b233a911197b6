"""The cluster bench's quick mode (``bench.scale_bench --cluster --quick``) runs end to end on a
local three-master cluster with 12 partitions (no timing assertions): every check runs again
and is counted on the master that holds its partition, each master holds four partitions and
costs the same commands per run, none asks for a script's keys (COMMAND GETKEYS), and one beat
tick over 20,000 checks publishes what every partition had due."""

from __future__ import annotations

import pytest
from support.benches import refused, run_bench


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cluster_bench_quick_reports_each_master_and_one_tick():
    figures = run_bench("scale_bench", "--cluster", "--quick", timeout=280)["cluster"]
    per_run, tick = figures["per_run"], figures["tick"]
    masters = per_run["masters"]
    assert len(masters) == 3
    assert [m["partitions"] for m in masters.values()] == [4, 4, 4]
    assert sum(m["runs"] for m in masters.values()) == per_run["runs"] == 1_200
    commands = [m["commands_per_run"] for m in masters.values()]
    assert min(commands) > 0 and max(commands) <= 1.1 * min(commands)  # the same path on each
    for master in masters.values():
        assert master["cpu_us_per_run"] > 0
        assert not any(k.startswith("command") for k in master["top_commands_per_run"])
    cpus = [m["cpu_us"] for m in masters.values()]
    assert per_run["balance"] == pytest.approx(max(cpus) / (sum(cpus) / 3))
    assert 1 <= per_run["balance"] < 2  # no master carries another's runs
    assert tick["checks"] == tick["jobs"] == 20_000
    assert tick["published"] == sum(tick["published_per_partition"])
    assert all(n > 0 for n in tick["published_per_partition"])  # every partition dispatched
    # a 10 s window of a 60 s period finds about a sixth of the jobs due
    assert 0.1 * tick["jobs"] < tick["published"] < 0.25 * tick["jobs"]
    assert tick["jobs_per_s"] == pytest.approx(tick["published"] / tick["tick_s"])
    assert tick["bytes_per_job"] > 0
    assert all(b > 0 for b in tick["bytes_per_job_on_master"].values())


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--checks", "5"), "--checks is an option of --cluster"),
        (("--tick-window", "5"), "--tick-window is an option of --cluster"),
        (("--cluster", "--checks", "0"), "--checks takes a whole number from 1, not 0"),
        (
            ("--cluster", "--tick-window", "0"),
            "--tick-window takes seconds above 0 up to 60, not 0",
        ),
        (("--cluster", "--side-by-side"), "--side-by-side are runs of their own: give one"),
    ],
)
def test_the_cluster_bench_refuses_its_options_out_of_range(args, named):
    """Refused before anything starts: exit 2, the option named, no traceback."""
    assert refused("scale_bench", *args).endswith(named)
