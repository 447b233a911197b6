"""Lease tokens after a restore: a claim never reissues a token a worker still holds.

A restore from an RDB snapshot brings back the job hashes as they were, while a worker that
claimed the job after the snapshot still runs with a newer token. A claim that issued that
very token again would have the stale worker's completion taken for the new run's. Tokens
are 64 random bits per claim call (``claiming.lease_token_prefix``): nothing a restore rolls
back decides them, and no ``TIME`` or counter is spent on them.
"""

from __future__ import annotations

from support.checks import at, register_fake_worker
from support.completion import finish
from support.partitions import pinned, suite_partitions
from support.round_trips import command_calls

from celery_app.checks.claiming import lease_token_prefix
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.redis.clock import server_time
from celery_app.redis.schema import job_id

#: c1 and c2 live in the first partition of the check half: one claim takes both
C1, C2 = (pinned(suite_partitions(), name) for name in ("c1", "c2"))
JOB = job_id(C1, "eu")


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


def test_a_claim_after_a_restore_never_reissues_a_live_token(r, keys, store, dispatcher_app):
    d, now = setup(r, keys, store, dispatcher_app)
    snapshot_token = claim(d, r, JOB, now)
    snapshot = {k: v for k, v in r.hgetall(keys.job(JOB)).items()}
    # after the snapshot: the run completes, the next tick claims the job again (worker W2)
    assert complete(r, store, snapshot_token, now + 1)
    live_token = claim(d, r, JOB, now + 20)
    assert live_token != snapshot_token

    # the restore: the job as it was at the snapshot; W2 still runs
    r.delete(keys.job(JOB))
    r.hset(keys.job(JOB), mapping=snapshot)
    assert complete(r, store, snapshot_token, now + 21)  # the restored lease completes
    new_token = claim(d, r, JOB, now + 40)
    assert new_token not in (live_token, snapshot_token)
    # W2's completion is refused: the job is held by the new claim only
    assert not complete(r, store, live_token, now + 41)
    assert read_job(r, keys, JOB).lease_token == new_token


def test_a_claim_spends_no_time_or_counter_and_its_tokens_are_its_own(
    r, keys, store, dispatcher_app
):
    """One claim of two jobs: one prefix, ``.1`` and ``.2`` after it; no ``TIME`` and no
    ``SET`` on the claim's round trips. Every claim call draws a prefix of its own."""
    d, now = setup(r, keys, store, dispatcher_app)
    store.create(uid=C2, tenant="t", kind="testprobe", target="x", period=10, regions=["eu"],
                 now=at(now - 30))  # fmt: skip
    before = command_calls(r)
    claims = {c.job_id: c.lease_token for c in d.tick(now).claims}
    ran = command_calls(r) - before
    assert set(claims) == {JOB, job_id(C2, "eu")}
    prefixes = {token.rpartition(".")[0] for token in claims.values()}
    assert len(prefixes) == 1
    assert sorted(token.rpartition(".")[2] for token in claims.values()) == ["1", "2"]
    assert ran["time"] == 0 and ran["set"] == 0, ran
    assert len({lease_token_prefix() for _ in range(1000)}) == 1000
