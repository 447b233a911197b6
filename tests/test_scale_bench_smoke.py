"""The scale bench's quick mode runs end to end (no timing assertions): every check of the
period runs once through checkbeat's own claim, publish and post-exec, and every cron firing is
recorded."""

from __future__ import annotations

import pytest
from support.benches import refused, run_bench


@pytest.mark.slow
def test_scale_bench_quick_mode_counts_every_run_and_firing():
    result = run_bench("scale_bench", "--quick", "--rounds", "2", timeout=180)
    checks, spare, cron = result["checks"], result["checks_spare"], result["cron"]
    assert checks["runs"] == spare["runs"] == 300  # every check claimed and run again
    assert checks["slots"] < 300 <= spare["slots"]  # a backlog, then spare capacity
    assert 0 < spare["state_commands_per_run"] < checks["state_commands_per_run"]
    assert checks["state_commands_per_run"] > 0
    assert checks["broker_commands_per_run"] > 1  # a BRPOP per delivery, and the publishes
    assert checks["runs_per_redis_core_s"] > 0  # what one Redis core sustains
    assert cron["firings"] == 100  # 50 tasks x 2 windows
    for name in ("checks", "checks_spare"):  # --rounds 2: each workload's CPU over both rounds
        cpu = result["cpu_rounds"][name]
        assert len(cpu["rounds"]) == 2 and cpu["min"] <= cpu["median"] <= cpu["max"]
        assert result[name]["state_cpu_us_per_run"] in cpu["rounds"]
    assert cron["state_commands_per_firing"] > 0 and cron["publish_commands_per_firing"] > 0


@pytest.mark.slow
def test_scale_bench_side_by_side_quick_measures_both_systems_on_one_server():
    """checkbeat's beat and worker, then plain Celery's producer and worker, on one
    redis-server: each ran at the load's rate, its runs were counted at the target and in its
    own records, and the per-run figures and their ratio come from those counts."""
    figures = run_bench("scale_bench", "--side-by-side", "--quick", timeout=240)["side_by_side"]
    side = figures["quick"]
    ours, plain = side["checkbeat"], side["plain"]
    for system in (ours, plain):
        assert system["runs"] > 0
        # every GET the target answered was a run the system recorded (up to the runs in
        # flight at the window's edges, one per slot)
        assert abs(system["recorded_runs"] - system["runs"]) <= side["slots"]
        assert system["runs_per_s"] >= 0.5 * side["load"]["rate"]
        assert system["commands_per_run"] > 0 and system["cpu_us_per_run"] > 0
        assert sum(system["commands"].values()) == pytest.approx(system["commands_per_run"])
        # the MONITOR sample splits the same commands between the state and the broker db
        split = system["state_commands_per_run"] + system["broker_commands_per_run"]
        assert split == pytest.approx(system["commands_per_run"], rel=0.25)
        assert system["monitored_runs"] > 0 and system["broker_commands_per_run"] > 0
        # a request read carries at least one command (a pipeline or a script, several)
        assert 0 < system["reads_per_run"] <= system["commands_per_run"]
        assert system["cpu_us_per_read"] == pytest.approx(
            system["cpu_us_per_run"] / system["reads_per_run"]
        )
    # the plain task's own state: its run record, once a run, beside kombu's and the events';
    # and on the state db, its three commands only
    assert plain["commands"]["rpush"] == pytest.approx(1.0, abs=0.25)
    assert plain["state_commands_per_run"] == pytest.approx(3.0, abs=0.6)
    assert ours["state_commands_per_run"] > 0
    assert plain["commands"]["publish"] > 0  # task events on
    for name in ("commands_per_run", "cpu_us_per_run", "bytes_per_run"):
        assert side["ratio"][name] == pytest.approx(ours[name] / plain[name])
    assert figures["idle_cpu_ms_per_s"] > 0


@pytest.mark.slow
def test_scale_bench_side_by_side_on_two_servers_measures_the_broker_apart():
    """--two-servers: the broker on a redis-server of its own. Each server's own counts say
    which commands went where (plain Celery's state is its three commands a run), the two
    servers' CPU add up to the run's, and the broker's alone is set against plain Celery's
    whole run. checkbeat's beat runs with the dispatch lead given, and runs every check."""
    figures = run_bench(
        "scale_bench", "--side-by-side", "--quick", "--two-servers", "--dispatch-lead", "0.2",
        timeout=240,
    )["side_by_side"]  # fmt: skip
    assert figures["two_servers"] is True
    side = figures["quick"]
    assert side["dispatch_lead_s"] == 0.2
    ours, plain = side["checkbeat"], side["plain"]
    for system in (ours, plain):
        assert system["runs"] >= 0.5 * side["load"]["rate"] * side["window_s"]
        assert abs(system["recorded_runs"] - system["runs"]) <= side["slots"]
        split = system["state_commands_per_run"] + system["broker_commands_per_run"]
        assert split == pytest.approx(system["commands_per_run"])  # counted, not sampled
        both = system["state_cpu_us_per_run"] + system["broker_cpu_us_per_run"]
        assert both == pytest.approx(system["cpu_us_per_run"])
        assert system["state_cpu_us_per_run"] > 0 and system["broker_cpu_us_per_run"] > 0
    assert plain["state_commands_per_run"] == pytest.approx(3.0, abs=0.6)
    assert ours["broker_commands_per_run"] < plain["broker_commands_per_run"]  # no acks
    assert side["ratio"]["broker_cpu_vs_plain_total"] == pytest.approx(
        ours["broker_cpu_us_per_run"] / plain["cpu_us_per_run"]
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--side-by-side", "--window", "0"), "--window takes seconds above 0, not 0"),
        (("--side-by-side", "--slots", "0"), "--slots takes a whole number from 1, not 0"),
        (("--warmup", "5"), "--warmup is an option of --side-by-side"),
        (("--two-servers",), "--two-servers is an option of --side-by-side"),
        (
            ("--side-by-side", "--dispatch-lead", "6"),
            "--dispatch-lead takes seconds from 0 up to 5, not 6",
        ),
        (("--rounds", "0"), "--rounds takes a whole number from 1, not 0"),
        (
            ("--side-by-side", "--rounds", "2"),
            "--rounds is an option of the check path's bench (see --repeat)",
        ),
    ],
)
def test_scale_bench_refuses_side_by_side_options_out_of_range(args, named):
    """Refused before anything starts: exit 2, the option named, no traceback."""
    assert refused("scale_bench", *args).endswith(named)
