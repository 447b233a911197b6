"""Who is quarantined and who releases them (``celery_app.checks.quarantine``), on real Redis.

The end-to-end scenario with workers is tests/faults/test_quarantine.py; here: a server that
refuses writes (OOM) blames no job, reconcile rebuilds a job hash it cannot read, enable and
delete release, and a definition that cannot be read keeps its jobs quarantined.
"""

from __future__ import annotations

import pytest
import redis
from support.checks import at, register_fake_worker
from support.partitions import first_partition_names

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.quarantine import failing_alone, is_job_error, read_quarantine
from celery_app.checks.repair import repair
from celery_app.redis.clock import server_time
from celery_app.redis.schema import CheckField, JobField, QuarantineStep

OOM = redis.ResponseError(  # as Redis 6.2 reports it from a script
    "Error running script (call to f_1): @user_script:62: @user_script: 62: -OOM command not "
    "allowed when used memory > 'maxmemory'."
)
BAD_FLOAT = redis.ResponseError(
    "Error running script (call to f_1): @user_script:54: ERR value is not a valid float"
)

#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def test_only_errors_of_the_jobs_own_data_are_blamed_on_it():
    assert (
        is_job_error(BAD_FLOAT) and is_job_error(ValueError("x")) and is_job_error(OverflowError())
    )
    assert not is_job_error(OOM)
    assert not is_job_error(redis.ResponseError("READONLY You can't write against a replica."))
    assert not is_job_error(redis.ConnectionError("gone"))
    assert failing_alone([None, BAD_FLOAT, None])  # one of many fails: its own fault
    assert failing_alone([BAD_FLOAT])  # a batch of one
    assert failing_alone([BAD_FLOAT, BAD_FLOAT])  # all torn: still theirs, not everyone's
    assert failing_alone([])
    assert not failing_alone([None, OOM])  # the server refused


def make(store, uid: str, now: float, **extra) -> str:
    store.create(uid=U(uid), tenant="t", kind="testprobe", target="x", period=10, regions=["eu"],
                 now=at(now - 30), **extra)  # fmt: skip
    return J(uid)


@pytest.fixture
def dispatcher(r, keys, dispatcher_app) -> Dispatcher:
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10)
    return Dispatcher(dispatcher_app, client=r, regions=["eu"])


def test_a_server_out_of_memory_quarantines_nothing(r, keys, store, dispatcher, redis_server):
    now = server_time(r)
    jobs = [make(store, f"m{i}", now) for i in range(4)]
    r.hset(keys.job(jobs[0]), JobField.EFFECTIVE_AT, "torn")  # one job's own fault as well
    limit = r.config_get("maxmemory")["maxmemory"]
    r.config_set("maxmemory", 1)
    try:
        # beat's tick: the promote, pipelined with the claim's reads, is refused; so is each
        # job's promote alone, so the refusal is the server's and the tick stops
        with pytest.raises(redis.ResponseError, match="OOM"):
            dispatcher.tick(now)
    finally:
        r.config_set("maxmemory", limit)
    assert r.scard(keys.quarantine()) == 0
    assert r.zcard(keys.due()) == 4  # nothing moved
    report = dispatcher.tick(now)  # memory back: the torn job alone is set aside
    assert report.promoted == 3
    assert sorted(c.job_id for c in report.claims) == jobs[1:]
    assert [q.job_id for q in read_quarantine(r, keys)] == [jobs[0]]


def test_reconcile_rebuilds_an_unreadable_job_hash_and_keeps_an_unreadable_definition(
    r, keys, store, dispatcher
):
    now = server_time(r)
    torn = make(store, "a", now)
    r.hset(keys.job(torn), JobField.RUNS, "lots")  # unreadable, still in the due index
    kept = make(store, "b", now)
    r.hset(keys.job(kept), JobField.COST_EWMA_MS, "bogus")
    claims = dispatcher.tick(now).claims  # "a" claimed, "b" quarantined by the claim
    assert [c.job_id for c in claims] == [torn]
    assert [(q.job_id, q.step) for q in read_quarantine(r, keys)] == [(kept, QuarantineStep.CLAIM)]
    r.hset(keys.check(U("b")), CheckField.PERIOD, "often")  # its definition torn too

    report = repair(r, keys, store.params, at(now))
    assert report.undecodable == (U("b"),)
    assert r.sismember(keys.quarantine(), kept)  # stays aside: nothing valid to rebuild from
    # "a": its leased hash could not be read: rebuilt as a new job, placed at its next tick
    assert torn in report.placed
    assert r.hget(keys.job(torn), JobField.RUNS) is None
    assert r.zscore(keys.due(), torn) is not None
    assert r.zscore(keys.leases("eu", 0), torn) is None


def test_enable_and_delete_release_quarantined_jobs(r, keys, store, dispatcher):
    now = server_time(r)
    on = make(store, "on", now)
    gone = make(store, "gone", now)
    for job in (on, gone):
        r.hset(keys.job(job), JobField.EFFECTIVE_AT, "torn")
    assert dispatcher.tick(now).claims == ()  # both set aside by the promote
    assert {q.job_id for q in read_quarantine(r, keys)} == {on, gone}
    store.set_enabled(U("on"), False, now=at(now))
    assert r.sismember(keys.quarantine(), on) == 0  # released, rebuilt disabled: in no index
    assert r.hget(keys.job(on), JobField.DISABLED) == "1"
    store.set_enabled(U("on"), True, now=at(now))
    assert r.zscore(keys.due(), on) is not None
    assert store.delete(U("gone"))
    assert r.scard(keys.quarantine()) == 0 and not r.exists(keys.job(gone))
    assert dispatcher.tick(now + 30).claims  # the rebuilt job is claimed like any other
