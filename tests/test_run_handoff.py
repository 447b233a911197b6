"""The post-exec write uses the job as ``run_check`` read it under its lease (no second read);
the write's lease check still refuses a run whose lease is gone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.checks import at

from celery_app.checks.jobs import finish_run_with_health, read_job
from celery_app.redis.schema import JobField
from scheduling_core import Params
from workers import run_handoff
from workers.run_handoff import RunRead

NOW = at(1_780_000_000.0)
PARAMS = Params(lane_slow_threshold_ms=1000, lane_fast_threshold_ms=500)


@pytest.fixture
def leased(store, r, keys):
    store.create(
        now=NOW, uid="c1", tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"]
    )
    r.zrem(keys.due(), "c1@eu")
    r.hset(keys.job("c1@eu"), mapping={"lt": "7.1", "lx": "1780000030"})
    r.zadd(keys.leases("eu", 0), {"c1@eu": 1780000030})
    return read_job(r, keys, "c1@eu")  # as run_check reads it: under the lease


def _finish(r, keys, known, token="7.1"):
    return finish_run_with_health(
        r,
        keys,
        PARAMS,
        "c1@eu",
        token,
        duration_ms=2000.0,
        timed_out=False,
        exec_start=at(known.scheduled_at + 0.5),
        now=at(known.scheduled_at + 2.5),
        known=known,
    )


def test_the_write_folds_the_run_into_the_job_the_run_read(r, keys, leased):
    # a field changed after the run read the job: the fold starts from the run's read
    r.hset(keys.job("c1@eu"), JobField.COST_EWMA_MS, "900.0")
    assert _finish(r, keys, leased) == (True, None)
    job = read_job(r, keys, "c1@eu")
    assert job.cost_ewma_ms == 2000.0 and job.lane == 1 and job.runs == 1  # from 0, not 900
    assert job.lease_token is None and r.zcard(keys.leases("eu", 0)) == 0
    assert int(job.scheduled_at) == int(leased.scheduled_at) + 60


def test_a_run_whose_lease_was_replaced_writes_nothing(r, keys, leased):
    r.hset(keys.job("c1@eu"), JobField.LEASE_TOKEN, "8.1")  # reaped and claimed again
    assert _finish(r, keys, leased) == (False, None)
    job = read_job(r, keys, "c1@eu")
    assert job.lease_token == "8.1" and job.runs == 0 and job.cost_ewma_ms == 0.0


def test_a_read_is_taken_once_by_its_lease_and_the_map_stays_bounded(leased):
    read = RunRead(leased, 100.0, 0.0, None)
    run_handoff.hand_over(read)
    assert run_handoff.take("c1@eu", "other") is None
    assert run_handoff.take("c1@eu", "7.1") is read
    assert run_handoff.take("c1@eu", "7.1") is None
    for i in range(run_handoff.MAX_PENDING + 10):
        run_handoff.hand_over(RunRead(replace(leased, lease_token=f"{i}"), 0.0, 0.0, None))
    assert len(run_handoff._pending) <= run_handoff.MAX_PENDING
    assert run_handoff.take("c1@eu", f"{run_handoff.MAX_PENDING + 9}") is not None
