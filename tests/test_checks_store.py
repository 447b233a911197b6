"""The check store: validation naming the field, nothing half-written, reconcile of jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.checks import at
from support.completion import write
from support.partitions import count_in
from support.state_db import snapshot

from celery_app.checks.jobs import CompletedRun, read_job
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.checks.store import CheckStore
from celery_app.errors import CheckExists, CheckFieldError
from scheduling_core import PostExecState

NOW = at(1_780_000_000.25)
UP_RECORD = RunRecord(RunStatus.UP, "eu", finished_at=NOW.timestamp())


def add(store: CheckStore, uid: str = "c1", **kw):
    fields = dict(uid=uid, tenant="acme", kind="testprobe", target="https://x", period=60)
    fields.update(kw)
    return store.create(now=NOW, **fields)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"uid": "a@b"}, "uid"),
        ({"uid": "a b"}, "uid"),
        ({"tenant": "t:1"}, "tenant"),
        ({"period": 0}, "period"),
        ({"period": 1.5}, "period"),
        ({"regions": ["mars"]}, "regions"),
        ({"region_spread": 60}, "region_spread"),
        ({"region_spread": -1}, "region_spread"),
        ({"plan_weight": -1}, "plan_weight"),
        ({"kind": "nope"}, "kind"),
        ({"config": {"timeout": -3}}, "config.timeout"),
        ({"config": "{not json"}, "config"),
        ({"target": ""}, "target"),
    ],
)
def test_invalid_definitions_name_the_field_and_write_nothing(store, r, override, field):
    with pytest.raises(CheckFieldError) as info:
        add(store, **override)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")
    assert r.dbsize() == 0


def test_create_places_one_job_per_region_on_its_phase(store, r, keys):
    defn = add(store, regions=["eu", "us", "ap"], config={"timeout": 2})
    assert defn.config == {"timeout": 2}
    jobs = store.jobs("c1")
    assert [j.region for j in jobs] == ["eu", "us", "ap"]
    for job in jobs:
        assert job.scheduled_at == r.zscore(keys.of_job(job.job_id).due(), job.job_id)
        # a new job's first tick: now itself (inside its phase second) up to a period ahead
        assert NOW.timestamp() <= job.scheduled_at < NOW.timestamp() + 60
        # fresh job: effective deadline = scheduled_at; nothing learned yet
        assert job.effective_scheduled_at == job.scheduled_at
        assert (job.cost_ewma_ms, job.lane, job.runs) == (0.0, 0, 0)
    # default spread = period / 3 = 20 s between consecutive regions in sorted order (ap, eu, us)
    by_region = {j.region: int(j.scheduled_at) % 60 for j in jobs}
    assert (by_region["eu"] - by_region["ap"]) % 60 == 20
    assert (by_region["us"] - by_region["eu"]) % 60 == 20
    assert store.list() == [defn]
    assert store.list(tenant="acme") == [defn]
    assert store.list(tenant="other") == []


def test_duplicate_create_is_refused(store):
    add(store)
    with pytest.raises(CheckExists):
        add(store, period=30)
    assert store.require("c1").definition.period == 60


def test_default_region_is_the_first_configured(store):
    assert add(store).regions == ("eu",)


def _run_once(r, keys, job, cost, lane):
    """Give a job a learned cost and lane as a completed run would (lease, then complete)."""
    r.hset(keys.job(job.job_id), mapping={"lt": "tok", "lx": "1"})
    state = PostExecState(
        cost_ewma_ms=cost, delay_ewma_ms=7.0, effective_scheduled_at=at(job.scheduled_at), lane=lane
    )
    nxt = at(job.scheduled_at + 60)
    assert write(r, keys, [CompletedRun(job.job_id, "tok", state, nxt)]) == [True]


def test_adding_and_removing_regions_moves_phases_by_the_spread_keeping_ewmas(store, r, keys):
    add(store, regions=["eu"])
    (eu,) = store.jobs("c1")
    _run_once(r, keys, eu, cost=1500.0, lane=1)
    store.update("c1", now=NOW, regions=["eu", "us"])
    jobs = {j.region: j for j in store.jobs("c1")}
    assert set(jobs) == {"eu", "us"}
    assert (jobs["eu"].cost_ewma_ms, jobs["eu"].delay_ewma_ms, jobs["eu"].lane) == (1500.0, 7.0, 1)
    assert jobs["eu"].runs == 1
    assert jobs["us"].cost_ewma_ms == 0.0
    # two regions: default spread 30 s; eu keeps index 0 in sorted (eu, us)
    assert (int(jobs["us"].scheduled_at) - int(jobs["eu"].scheduled_at)) % 60 == 30
    # eu's effective deadline carries its cost offset (2 x 1500 ms)
    assert jobs["eu"].effective_scheduled_at == pytest.approx(jobs["eu"].scheduled_at + 3.0)

    store.update("c1", now=NOW, regions=["us"], region_spread=10)
    (us,) = store.jobs("c1")
    assert us.region == "us" and us.region_spread_s == 10.0
    assert not r.exists(keys.job("c1@eu"))
    assert r.zscore(keys.of_check("c1").due(), "c1@eu") is None
    # single region: index 0, so the phase is the jitter alone
    assert int(us.scheduled_at) % 60 == int(eu.scheduled_at) % 60


def test_spread_override_sets_the_offset_between_regions(store):
    add(store, regions=["eu", "us"], region_spread=5)
    jobs = {j.region: j for j in store.jobs("c1")}
    assert (int(jobs["us"].scheduled_at) - int(jobs["eu"].scheduled_at)) % 60 == 5
    store.update("c1", now=NOW, region_spread=None)
    jobs = {j.region: j for j in store.jobs("c1")}
    assert jobs["us"].region_spread_s is None
    assert (int(jobs["us"].scheduled_at) - int(jobs["eu"].scheduled_at)) % 60 == 30


def test_weight_or_config_change_keeps_the_schedule(store):
    add(store, regions=["eu"])
    before = store.jobs("c1")[0]
    store.update("c1", now=at(NOW.timestamp() + 7), plan_weight=3, config={"timeout": 1})
    after = store.jobs("c1")[0]
    assert after.scheduled_at == before.scheduled_at
    assert after.plan_weight == 3
    assert store.require("c1").definition.config == {"timeout": 1}


def test_invalid_update_writes_nothing(store, r):
    add(store)
    before = snapshot(r)
    with pytest.raises(CheckFieldError) as info:
        store.update("c1", regions=["eu", "mars"])
    assert info.value.field == "regions"
    assert snapshot(r) == before


def test_disable_takes_jobs_out_of_every_index_and_enable_places_them(store, r, keys):
    add(store, regions=["eu", "us"])
    store.set_enabled("c1", False, now=NOW)
    assert count_in(r, keys, lambda k: k.due()) == 0
    assert all(not j.enabled for j in store.jobs("c1"))
    store.set_enabled("c1", True, now=at(NOW.timestamp() + 120))
    jobs = store.jobs("c1")
    assert all(j.enabled for j in jobs)
    assert count_in(r, keys, lambda k: k.due()) == 2
    assert all(j.scheduled_at > NOW.timestamp() + 120 for j in jobs)


def test_tenant_change_moves_the_check_between_tenant_lists(store):
    add(store)
    store.update("c1", tenant="globex")
    assert [d.uid for d in store.list(tenant="globex")] == ["c1"]
    assert store.list(tenant="acme") == []
    assert store.jobs("c1")[0].tenant == "globex"


def test_delete_removes_jobs_leases_and_discards_a_started_run(store, r, keys):
    add(store, regions=["eu", "us"])
    eu = read_job(r, keys, "c1@eu")
    # the job is claimed (leased) and running when the check is deleted
    r.hset(keys.job("c1@eu"), mapping={"lt": "tok", "lx": str(NOW.timestamp() + 20)})
    r.zadd(keys.of_check("c1").leases("eu", 0), {"c1@eu": NOW.timestamp() + 20})
    r.zrem(keys.of_check("c1").due(), "c1@eu")
    assert store.delete("c1") is True
    assert store.get("c1") is None
    assert r.dbsize() == 0, r.keys("*")
    state = PostExecState(10.0, 0.0, at(eu.scheduled_at), 0)
    done = write(
        r, keys, [CompletedRun("c1@eu", "tok", state, at(eu.scheduled_at + 60), UP_RECORD)]
    )
    assert done == [False]
    assert r.dbsize() == 0
    assert store.delete("c1") is False


def test_create_many_is_batched_and_all_or_nothing(store, r, keys):
    from celery_app.checks.definition import validate_definition

    defs = [
        validate_definition(
            store.settings,
            uid=f"m{i}",
            tenant="t",
            kind="testprobe",
            target="x",
            period=60,
            regions=["eu", "us"],
        )
        for i in range(1200)
    ]
    assert store.create_many(defs, now=NOW, chunk=500) == 1200
    assert count_in(r, keys, lambda k: k.due()) == 2400
    assert sum(r.scard(part.checks()) for part in keys.every_partition()) == 1200
    with pytest.raises(CheckExists):
        store.create_many([defs[0]], now=NOW)


def test_next_tick_of_a_job_matches_its_definition(store, r, keys):
    defn = add(store, regions=["eu", "us", "ap"], region_spread=7)
    for job in store.jobs("c1"):
        later = at(NOW.timestamp() + 1000.5)
        assert job.next_scheduled_at(later) == defn.next_tick(job.region, later)
        assert job.spread() == timedelta(seconds=7)


def test_reconcile_leaves_a_running_job_to_its_completion(store, r, keys):
    add(store, regions=["eu"])
    r.zrem(keys.of_check("c1").due(), "c1@eu")
    r.hset(keys.job("c1@eu"), mapping={"lt": "run-1", "lx": str(NOW.timestamp() + 20)})
    r.zadd(keys.of_check("c1").leases("eu", 0), {"c1@eu": NOW.timestamp() + 20})
    store.update("c1", now=NOW, period=30, regions=["eu", "us"])
    # the running job keeps its lease and is not placed twice; the new region's job is placed
    assert r.zscore(keys.of_check("c1").due(), "c1@eu") is None
    assert r.zscore(keys.of_check("c1").due(), "c1@us") is not None
    job = read_job(r, keys, "c1@eu")
    assert job.lease_token == "run-1" and job.period_s == 30 and job.regions == ("eu", "us")
    # its completion places it on the new phase (the worker computes it from the job's fields)
    now = at(NOW.timestamp() + 3)
    nxt = job.next_scheduled_at(now)
    state = PostExecState(5.0, 0.0, nxt, 0)
    assert write(r, keys, [CompletedRun("c1@eu", "run-1", state, nxt)]) == [True]
    us = read_job(r, keys, "c1@us")
    assert (int(us.scheduled_at) - int(nxt.timestamp())) % 30 == 15  # spread = 30 / 2


def test_a_check_created_inside_its_phase_second_is_due_at_once(store, r, keys):
    from scheduling_core import jitter_for

    phase_s = int(jitter_for("c1", timedelta(seconds=60)).total_seconds())
    minute = int(NOW.timestamp()) // 60 * 60
    inside = at(minute + 60 + phase_s + 0.4)  # in the second the phase aligns to
    defn = store.create(
        now=inside, uid="c1", tenant="acme", kind="testprobe", target="https://x", period=60
    )
    (job,) = store.jobs("c1")
    # not a whole period later: a new job has not just fired in this second
    assert job.scheduled_at == pytest.approx(inside.timestamp(), abs=1e-3)
    assert r.zscore(keys.of_job(job.job_id).due(), job.job_id) == job.scheduled_at
    # a job placed again (its phase moved) still never ticks twice within a second
    later = defn.next_tick("eu", inside)
    assert later.timestamp() == pytest.approx(inside.timestamp() + 60, abs=1e-3)
