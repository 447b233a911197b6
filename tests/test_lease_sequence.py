"""Lease tokens after a restore: a lost or rolled-back sequence counter never reissues a token.

A restore from an RDB snapshot brings back the counter (``Keys.lease_seq``) and the job hashes
as they were, while a worker that claimed the job after the snapshot still runs with a newer
token. Counting on from the old value would hand that very token to the next claim of the job,
and the stale worker's completion would then be taken for the new run's. The claim keeps the
counter at or above Redis's clock in microseconds, and reconcile raises it above every token a
job holds.
"""

from __future__ import annotations

from support.checks import at, register_fake_worker
from support.completion import finish
from support.partitions import pinned, suite_partitions

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.checks.repair import repair
from celery_app.redis.clock import server_time
from celery_app.redis.schema import JobField, job_id

#: c1 and c2 live in the first partition of the check half: one lease sequence, the one
#: ``keys`` and the dispatcher read
C1, C2 = (pinned(suite_partitions(), name) for name in ("c1", "c2"))
JOB = job_id(C1, "eu")


def sequence(token: str) -> int:
    return int(token.partition(".")[0])


def claim(d: Dispatcher, r, job: str, now: float) -> str:
    """Beat's tick at ``now``; the lease token ``job`` got."""
    tokens = {c.job_id: c.lease_token for c in d.tick(now).claims}
    assert job in tokens, f"{job} not claimed at {now}"
    return tokens[job]


def complete(r, store, token: str, now: float) -> bool:
    written, _transition = finish(
        r, store.keys, store.settings, JOB, token, params=store.params, exec_start=at(now),
        now=at(now),
    )  # fmt: skip
    return written


def setup(r, keys, store, dispatcher_app) -> tuple[Dispatcher, float]:
    now = server_time(r)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    store.create(uid=C1, tenant="t", kind="testprobe", target="x", period=10, regions=["eu"],
                 now=at(now - 30))  # fmt: skip
    return Dispatcher(dispatcher_app, client=r), now


def test_a_counter_rolled_back_by_a_restore_never_reissues_a_live_token(
    r, keys, store, dispatcher_app
):
    d, now = setup(r, keys, store, dispatcher_app)
    snapshot_token = claim(d, r, JOB, now)
    snapshot = {k: v for k, v in r.hgetall(keys.job(JOB)).items()}
    counter = r.get(keys.lease_seq())
    # after the snapshot: the run completes, the next tick claims the job again (worker W2)
    assert complete(r, store, snapshot_token, now + 1)
    live_token = claim(d, r, JOB, now + 20)
    assert sequence(live_token) > sequence(snapshot_token)

    # the restore: the counter and the job as they were at the snapshot; W2 still runs
    r.set(keys.lease_seq(), counter)
    r.delete(keys.job(JOB))
    r.hset(keys.job(JOB), mapping=snapshot)
    assert complete(r, store, snapshot_token, now + 21)  # the restored lease completes
    new_token = claim(d, r, JOB, now + 40)
    assert new_token != live_token
    assert sequence(new_token) > sequence(live_token)
    # W2's completion is refused: the job is held by the new claim only
    assert not complete(r, store, live_token, now + 41)
    assert read_job(r, keys, JOB).lease_token == new_token


def test_a_lost_counter_starts_above_the_clock_and_reconcile_above_every_held_token(
    r, keys, store, dispatcher_app
):
    d, now = setup(r, keys, store, dispatcher_app)
    first = claim(d, r, JOB, now)
    clock_us = int(server_time(r) * 1_000_000)
    assert sequence(first) >= clock_us - 5_000_000  # seeded from Redis TIME, not from 1

    # a token from a server whose clock ran 11 days ahead, then the counter lost
    ahead = clock_us + 10**12
    r.hset(keys.job(JOB), JobField.LEASE_TOKEN, f"{ahead}.1")
    r.delete(keys.lease_seq())
    repair(r, keys, store.params, at(now))
    assert int(r.get(keys.lease_seq())) == ahead
    store.create(uid=C2, tenant="t", kind="testprobe", target="x", period=10, regions=["eu"],
                 now=at(now - 30))  # fmt: skip
    token = claim(d, r, job_id(C2, "eu"), now + 1)
    assert sequence(token) > ahead
    # reconcile never lowers the counter
    repair(r, keys, store.params, at(now))
    assert int(r.get(keys.lease_seq())) >= sequence(token)
