"""complete.lua: the one write after a run, idempotent per lease token (through
``support.completion``: the reaper's batch write and the worker's write after a re-read)."""

from __future__ import annotations

import json

import pytest
from support.checks import at
from support.completion import finish, write
from support.partitions import pinned, suite_partitions

from celery_app.checks.jobs import CompletedRun, lease_is_current, read_job
from celery_app.checks.run_contract import RunRecord, RunStatus
from scheduling_core import Params, PostExecState

NOW = at(1_780_000_000.0)
#: c1 lives in the first partition of the check half, the one ``keys`` reads
C1 = pinned(suite_partitions(), "c1")


def record(**kw) -> RunRecord:
    return RunRecord(RunStatus.UP, "eu", finished_at=NOW.timestamp(), **kw)


@pytest.fixture
def leased(store, r, keys):
    store.create(
        now=NOW,
        uid=C1,
        tenant="acme",
        kind="testprobe",
        target="x",
        period=60,
        regions=["eu", "us"],
    )
    job = read_job(r, keys, f"{C1}@eu")
    r.zrem(keys.due(), f"{C1}@eu")
    r.hset(keys.job(f"{C1}@eu"), mapping={"lt": "7.1", "lx": "1780000030"})
    r.zadd(keys.leases("eu", 0), {f"{C1}@eu": 1780000030})
    return job


def test_complete_writes_state_releases_lease_places_job_and_records_result(r, keys, leased):
    state = PostExecState(
        cost_ewma_ms=1200.0,
        delay_ewma_ms=15.0,
        effective_scheduled_at=at(leased.scheduled_at + 62.4),
        lane=1,
    )
    nxt = at(leased.scheduled_at + 60)
    assert lease_is_current(r, keys, f"{C1}@eu", "7.1")
    done = record(latency_ms=1200.0, lane="fast")
    assert write(r, keys, [CompletedRun(f"{C1}@eu", "7.1", state, nxt, done)]) == [True]
    job = read_job(r, keys, f"{C1}@eu")
    assert (job.cost_ewma_ms, job.delay_ewma_ms, job.lane, job.runs) == (1200.0, 15.0, 1, 1)
    assert job.effective_scheduled_at == pytest.approx(leased.scheduled_at + 62.4)
    assert job.lease_token is None and job.lease_expiry is None
    assert r.zscore(keys.due(), f"{C1}@eu") == pytest.approx(nxt.timestamp())
    assert r.zcard(keys.leases("eu", 0)) == 0
    entries = r.xrange(keys.results(C1))
    assert [json.loads(e[1]["result"]) for e in entries] == [done.as_dict()]
    assert [e[1]["region"] for e in entries] == ["eu"]
    assert json.loads(r.hget(keys.last_result(C1), "eu")) == done.as_dict()
    # the same token again (a late duplicate, or the reaper racing the worker): nothing written
    again = CompletedRun(f"{C1}@eu", "7.1", state, at(nxt.timestamp() + 60), record())
    assert write(r, keys, [again]) == [False]
    assert read_job(r, keys, f"{C1}@eu").runs == 1
    assert len(r.xrange(keys.results(C1))) == 1
    assert not lease_is_current(r, keys, f"{C1}@eu", "7.1")


def test_a_record_has_one_documented_shape():
    assert list(record().as_dict()) == [
        "status",
        "region",
        "lane",
        "queue",
        "worker",
        "scheduled_at",
        "started_at",
        "finished_at",
        "latency_ms",
        "duration_ms",
        "timed_out",
        "timeout_s",
        "error_class",
        "error",
        "detail",
        "maintenance",
        "degraded",
    ]
    lost = RunRecord.lost(
        f"{C1}@eu", lane=1, scheduled_at=NOW.timestamp(), now=NOW.timestamp() + 30
    )
    assert list(lost.as_dict()) == list(record().as_dict())
    assert lost.as_dict() | {"error": None} == {
        **dict.fromkeys(record().as_dict()),
        "status": "lost",
        "region": "eu",
        "lane": "slow",
        "scheduled_at": NOW.isoformat(),
        "finished_at": at(NOW.timestamp() + 30).isoformat(),
        "timed_out": True,
        "error_class": "lost",
        "detail": {},
        "maintenance": False,
    }


def test_wrong_token_writes_nothing(r, keys, leased):
    state = PostExecState(1.0, 1.0, at(leased.scheduled_at), 0)
    stale = CompletedRun(f"{C1}@eu", "other", state, at(leased.scheduled_at + 60))
    assert write(r, keys, [stale]) == [False]
    assert read_job(r, keys, f"{C1}@eu").lease_token == "7.1"
    assert r.zcard(keys.leases("eu", 0)) == 1


def test_a_finished_run_folds_post_exec_and_next_tick(r, keys, settings, leased):
    params = Params(lane_slow_threshold_ms=1000, lane_fast_threshold_ms=500)
    now = at(leased.scheduled_at + 2.5)
    assert finish(
        r,
        keys,
        settings,
        f"{C1}@eu",
        "7.1",
        params=params,
        duration_ms=2000.0,
        timed_out=False,
        exec_start=at(leased.scheduled_at + 0.5),
        now=now,
        record=record(),
    ) == (True, None)
    job = read_job(r, keys, f"{C1}@eu")
    # the record carries the lane the run was claimed in (fast), not the one it moves to
    (last,) = [json.loads(e[1]["result"]) for e in r.xrange(keys.results(C1))]
    assert last["lane"] == "fast" and last["status"] == "up"
    assert job.cost_ewma_ms == 2000.0 and job.lane == 1
    assert job.delay_ewma_ms == pytest.approx(500.0)
    # the next tick is on the job's phase second; next_aligned carries now's sub-second part
    assert int(job.scheduled_at) == int(leased.scheduled_at) + 60
    assert job.effective_scheduled_at == pytest.approx(job.scheduled_at + 4.0, abs=1e-3)


@pytest.mark.parametrize(("ended_s", "passed"), [(2.5, 0), (59.9, 0), (61.0, 1), (150.0, 2)])
def test_ticks_a_late_run_passed_over_are_counted_in_the_job(
    r, keys, settings, leased, ended_s, passed
):
    """A run that ends after its next tick's second (late, long, or completed after a
    failover) places the job strictly after now: the ticks between are not run, and counted."""
    assert finish(
        r,
        keys,
        settings,
        f"{C1}@eu",
        "7.1",
        params=Params(),
        duration_ms=100.0,
        timed_out=False,
        exec_start=at(leased.scheduled_at),
        now=at(leased.scheduled_at + ended_s),
        record=record(),
    ) == (True, None)
    job = read_job(r, keys, f"{C1}@eu")
    assert int(job.scheduled_at) == int(leased.scheduled_at) + 60 * (passed + 1)
    assert (job.runs, job.passed) == (1, passed)
    assert (r.hget(keys.job(f"{C1}@eu"), "ps") is None) == (passed == 0)  # written only when some


def test_results_stream_is_capped(r, keys, leased):
    state = PostExecState(1.0, 1.0, at(leased.scheduled_at), 0)
    for i in range(300):
        r.hset(keys.job(f"{C1}@eu"), "lt", f"t{i}")
        run = CompletedRun(
            f"{C1}@eu", f"t{i}", state, at(leased.scheduled_at + 60), record(latency_ms=float(i))
        )
        assert write(r, keys, [run], results_maxlen=20) == [True]
    assert r.xlen(keys.results(C1)) < 120
