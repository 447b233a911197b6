"""The broker bench's quick mode runs end to end: real checkbeat and plain Celery workers on one
measured broker, task events on and off, and figures that say what each run cost the broker
(no timing assertions beyond the rates being delivered)."""

from __future__ import annotations

import pytest
from support.benches import refused, run_bench


@pytest.mark.slow
def test_broker_bench_quick_measures_both_systems_with_events_on_and_off():
    figures = run_bench("broker_bench", "--quick", timeout=300)
    for mode, events in (("events_on", True), ("events_off", False)):
        got = figures[mode]
        assert got["checkbeat"].keys() == got["plain"].keys() == {"100.0", "max"}
        for rate, ours in got["checkbeat"].items():
            theirs = got["plain"][rate]
            for system in (ours, theirs):
                assert system["runs"] > 0 and system["cpu_us_per_run"] > 0
                assert sum(system["commands"].values()) == pytest.approx(system["commands_per_run"])
                assert system["runs_per_broker_core_s"] == pytest.approx(
                    1e6 / system["cpu_us_per_run"]
                )
                # one BRPOP delivers each run, whichever system
                assert system["commands"]["brpop"] == pytest.approx(1.0, abs=0.15)
            if rate != "max":
                assert ours["runs_per_s"] == pytest.approx(100, rel=0.2)
                assert theirs["runs_per_s"] == pytest.approx(100, rel=0.2)
            else:
                assert ours["limit"] in ("broker", "workers", "publisher")
                assert ours["messages_per_publish"] > 1  # beat's batches: one LPUSH per queue
            # check queues are consumed without acks: no unacked record, no ack transaction;
            # plain Celery's late acks write both (MULTI/EXEC twice a run)
            assert "multi" not in ours["commands"] and "zadd" not in ours["commands"]
            assert theirs["commands"]["multi"] == pytest.approx(2.0, abs=0.2)
            # task events are PUBLISHes on the broker, only when on
            assert ("publish" in ours["commands"]) is events
            assert ("publish" in theirs["commands"]) is events
            assert ours["commands_per_run"] < theirs["commands_per_run"]
            for name, value in got["ratio"][rate].items():
                # one round: the ratio of the round's figures, and a range of that one value
                assert value == pytest.approx(ours[name] / theirs[name])
                assert got["ratio_range"][rate][name] == pytest.approx([value, value])
        one_core = figures["one_core"][mode]
        for at in ("fixed", "max"):
            figure = one_core[at]
            assert figure["runs_per_core_s_at_50"] == pytest.approx(
                0.5e6 / figure["cpu_us_per_run"]
            )
            assert figure["checks_of_60s_at_50"] == pytest.approx(
                60 * figure["runs_per_core_s_at_50"]
            )
    assert figures["idle_cpu_ms_per_s"] > 0


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--window", "0"), "--window takes seconds above 0, not 0"),
        (("--warmup", "-1"), "--warmup takes seconds above 0, not -1"),
        (("--workers", "0"), "--workers takes a whole number from 1, not 0"),
        (("--repeat", "0"), "--repeat takes a whole number from 1, not 0"),
    ],
)
def test_broker_bench_refuses_options_out_of_range(args, named):
    """Refused before anything starts: exit 2, the option named, no traceback."""
    assert refused("broker_bench", *args).endswith(named)
