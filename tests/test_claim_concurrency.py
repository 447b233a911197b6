"""Two-phase claims under concurrency: what one claimer read may be stale when its script runs.

The interleavings are forced (phase 1 of one claimer, all of another, then phase 2 of the first)
so the script's re-validation is what is tested; a threaded run then hammers one region with
dispatchers and refills at once and checks the invariants after every round.
"""

from __future__ import annotations

import random

import pytest
import redis
from support.at_once import at_once
from support.checks import at, learned, register_fake_worker
from support.completion import finish
from support.partitions import pinned, suite_partitions
from support.round_trips import command_calls

from celery_app.checks.claiming import ClaimStop, RegionClaimer, promote_due
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.ratelimit import clear_rate_limit, set_rate_limit
from celery_app.redis.schema import JobField

T0 = 1_780_000_000.0
#: A partition's share of a tenant's bucket is its rate and burst / P: the buckets below are P
#: times the one each test reasons about (its checks share the first partition).
P = suite_partitions()
EXPIRY = T0 + 60


def make_jobs(store, r, keys, n: int, *, tenant: str = "acme", slow_every: int = 0) -> list[str]:
    """n checks in eu, due at T0 + i ms (so the claim order is the creation order), all in the
    first partition of the check half (the claims below are one partition's)."""
    ids = []
    for i in range(n):
        uid = pinned(keys, f"{tenant[0]}{i:03d}")
        store.create(
            now=at(T0 - 100), uid=uid, tenant=tenant, kind="testprobe", target="x", period=60
        )
        slow = bool(slow_every) and i % slow_every == 0
        learned(
            r,
            keys,
            store.params,
            f"{uid}@eu",
            scheduled_at=T0 + i * 0.001,
            cost_ms=3000.0 if slow else 10.0,
            lane=1 if slow else 0,
        )
        ids.append(f"{uid}@eu")
    return ids


def leased(r, keys) -> list[str]:
    return r.zrange(keys.leases("eu", 0), 0, -1) + r.zrange(keys.leases("eu", 1), 0, -1)


def test_a_claim_never_takes_what_another_claimed_after_it_read(r, keys, store):
    ids = make_jobs(store, r, keys, 30)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10)
    promote_due(r, keys, T0 + 1, 5000)
    a, b = RegionClaimer(r, keys, "eu"), RegionClaimer(r, keys, "eu")
    state = a._state()
    read = a._read(state, 32, T0 + 1)  # A has read all 30 candidates and 10 free slots
    assert len(read.ready[0]) == 30 and state.slots.free == 10
    b_state = b._state()
    taken = b._round(b_state, b._read(b_state, 32, T0 + 1), T0 + 1, EXPIRY, 4, 100)[2]
    assert [c.job_id for c in taken] == ids[:4]  # B took the best 4 meanwhile...
    slots, stop, got, _ = a._round(state, read, T0 + 1, EXPIRY, 10, 100)
    # ... so A skips them (no longer ready) and the script's own count leaves A 6 slots
    assert slots.in_flight_fast == 4
    assert [c.job_id for c in got] == ids[4:10]
    assert stop == ClaimStop.FULL
    assert sorted(leased(r, keys)) == sorted(ids[:10])
    assert len({c.lease_token for c in taken + got}) == 10


def test_a_claim_whose_slots_were_taken_meanwhile_claims_nothing(r, keys, store):
    make_jobs(store, r, keys, 12)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=5)
    promote_due(r, keys, T0 + 1, 5000)
    a, b = RegionClaimer(r, keys, "eu"), RegionClaimer(r, keys, "eu")
    state = a._state()
    read = a._read(state, 32, T0 + 1)
    assert len(b.claim(T0 + 1, EXPIRY, batch=100, max_holds=100).claims) == 5
    slots, stop, got, _ = a._round(state, read, T0 + 1, EXPIRY, 5, 100)
    assert (got, stop, slots.free) == ([], ClaimStop.FULL, 0)
    assert len(leased(r, keys)) == 5


def test_a_worker_gone_between_the_phases_is_not_counted(r, keys, store):
    make_jobs(store, r, keys, 8)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=3)
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=3)
    promote_due(r, keys, T0 + 1, 5000)
    a = RegionClaimer(r, keys, "eu")
    state = a._state()
    read = a._read(state, 32, T0 + 1)
    assert state.slots.total == 6
    r.delete(keys.worker("w2"))  # its heartbeat expired
    slots, _stop, got, _ = a._round(state, read, T0 + 1, EXPIRY, 6, 100)
    assert slots.total == 3 and len(got) == 3
    assert not r.sismember(keys.region_workers("eu"), "w2")


def test_a_promote_never_readds_a_job_claimed_after_it_read(r, keys, store):
    ids = make_jobs(store, r, keys, 6)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=6)
    due = r.zrangebyscore(keys.due(), "-inf", T0 + 1)
    assert sorted(due) == sorted(ids)
    # another beat promotes and claims everything between this promote's read and its script
    promote_due(r, keys, T0 + 1, 5000)
    assert len(RegionClaimer(r, keys, "eu").claim(T0 + 1, EXPIRY, batch=10, max_holds=10).claims)
    from celery_app.redis.scripts import run_script
    from scheduling_core import LANE_FAST, LANE_SLOW

    moved, *placed, late = run_script(
        r,
        "promote",
        keys=[
            keys.due(),
            keys.heartbeats_late(),
            keys.ready("eu", LANE_FAST),
            keys.ready("eu", LANE_SLOW),
            *map(keys.job, due),
        ],
        args=[repr(T0 + 1), 1, "\n".join(due), " ".join("1" for _ in due)],
    )
    assert moved == 0 and placed == [0, 0] and late == 0
    assert r.zcard(keys.ready("eu", 0)) == 0 and len(leased(r, keys)) == 6


def test_a_tenant_limited_after_the_read_is_not_claimed_past_its_bucket(r, keys, store):
    ids = make_jobs(store, r, keys, 6)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=6)
    promote_due(r, keys, T0 + 1, 5000)
    a = RegionClaimer(r, keys, "eu")
    state = a._state()  # acme had no bucket when A read: A declares none
    read = a._read(state, 32, T0 + 1)
    set_rate_limit(r, keys, "acme", per_minute=1 * P, burst=2 * P)
    _slots, stop, got, _ = a._round(state, read, T0 + 1, EXPIRY, 6, 100)
    assert (got, stop) == ([], ClaimStop.MORE)  # the undeclared bucket: nothing taken, read again
    again = a.claim(T0 + 1, EXPIRY, batch=6, max_holds=100)
    assert [c.job_id for c in again.claims] == ids[:2] and again.rate_limited == 4


def claim_at_once(dispatchers: list[Dispatcher], now: float) -> list[list]:
    """Dispatchers 0 and 1 tick, the others refill region eu, all released by one barrier."""
    return at_once(
        [
            (lambda d=d: list(d.tick(now).claims))
            if k < 2
            else (lambda d=d: list(d.refill("eu", now)))
            for k, d in enumerate(dispatchers)
        ]
    )


@pytest.mark.timeout(120)
def test_concurrent_dispatchers_and_refills_never_double_claim_nor_overfill(
    r, keys, store, dispatcher_app, broker, redis_url
):
    """Two dispatchers and two refilling 'workers' claim one region at once, round after round;
    runs finish at random. After every round: no job leased twice or both leased and ready, no
    lane over its capacity, every lease token distinct."""
    make_jobs(store, r, keys, 60, slow_every=3)
    make_jobs(store, r, keys, 20, tenant="zeta")
    set_rate_limit(r, keys, "zeta", per_minute=30 * P, burst=3 * P)
    register_fake_worker(r, keys, "fast", region="eu", role="fast", concurrency=4)
    register_fake_worker(r, keys, "shared", region="eu", role="shared", concurrency=8)
    clients = [redis.Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    dispatchers = [Dispatcher(dispatcher_app, client=c) for c in clients]
    rng = random.Random(7)
    tokens: set[str] = set()
    claimed_total = 0
    now = T0 + 1
    for _round in range(25):
        got = claim_at_once(dispatchers, now)
        claims = [c for batch in got for c in batch]
        ids = [c.job_id for c in claims]
        assert len(ids) == len(set(ids)), "a job was claimed twice in one round"
        for c in claims:
            assert c.lease_token not in tokens
            tokens.add(c.lease_token)
        fast, slow = r.zrange(keys.leases("eu", 0), 0, -1), r.zrange(keys.leases("eu", 1), 0, -1)
        assert len(fast) + len(slow) <= 12 and len(slow) <= 8
        assert not set(fast + slow) & set(r.zrange(keys.ready("eu", 0), 0, -1)), "leased+ready"
        assert not set(fast + slow) & set(r.zrange(keys.ready("eu", 1), 0, -1)), "leased+ready"
        claimed_total += len(claims)
        # some runs finish, freeing slots for the next round
        now += 1.0
        for job in fast + slow:
            if rng.random() < 0.6:
                token = r.hget(keys.job(job), JobField.LEASE_TOKEN)
                assert finish(
                    r,
                    keys,
                    store.settings,
                    job,
                    token,
                    params=store.params,
                    duration_ms=10.0,
                    exec_start=at(now - 0.5),
                    now=at(now),
                )[0]
    assert claimed_total > 50  # the region was busy, not idle
    for c in clients:
        c.close()


# --- the claimer's cache: what changes rarely is read again only when it changed --------------


def finished(r, keys, store, job: str, now: float) -> None:
    """The run of leased ``job`` finished: its slot is free."""
    token = r.hget(keys.job(job), JobField.LEASE_TOKEN)
    assert finish(
        r,
        keys,
        store.settings,
        job,
        token,
        params=store.params,
        duration_ms=10.0,
        exec_start=at(now - 0.5),
        now=at(now),
    )[0]


def test_a_warm_claimer_reads_neither_the_tenant_sets_nor_the_worker_hashes_again(r, keys, store):
    ids = make_jobs(store, r, keys, 10)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=2)
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=2)
    promote_due(r, keys, T0 + 1, 5000)
    a = RegionClaimer(r, keys, "eu")
    assert len(a.claim(T0 + 1, EXPIRY, batch=100, max_holds=100).claims) == 4  # reads in full
    for job in ids[:2]:
        finished(r, keys, store, job, T0 + 2)
    before = command_calls(r)
    assert len(a.claim(T0 + 2, EXPIRY, batch=100, max_holds=100).claims) == 2
    spent = command_calls(r) - before
    # the cache's two checks (version, worker set size) and the leases in flight; the script
    # still reads each worker's hash itself (2 HMGETs) besides the 2 candidates' job hashes
    assert "smembers" not in spent, spent
    assert (spent["get"], spent["scard"], spent["zcard"]) == (1, 1, 2 + 2), spent
    assert spent["hmget"] == 2 + 2, spent


def test_a_cached_claim_never_counts_a_worker_whose_heartbeat_expired(r, keys, store):
    ids = make_jobs(store, r, keys, 20)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=2)
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=3)
    promote_due(r, keys, T0 + 1, 5000)
    a = RegionClaimer(r, keys, "eu")
    assert len(a.claim(T0 + 1, EXPIRY, batch=100, max_holds=100).claims) == 5
    for job in ids[:3]:
        finished(r, keys, store, job, T0 + 2)
    r.delete(keys.worker("w2"))  # its heartbeat expired: the cache still counts 5 slots
    got = a.claim(T0 + 2, EXPIRY, batch=100, max_holds=100)
    assert got.claims == [] and got.slots.total == 2  # 2 in flight on w1's 2 slots: none free
    assert len(leased(r, keys)) == 2
    assert not r.sismember(keys.region_workers("eu"), "w2")


def test_a_cached_claim_counts_a_new_worker_a_new_concurrency_and_stuck_slots(r, keys, store):
    ids = make_jobs(store, r, keys, 30)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=2)
    promote_due(r, keys, T0 + 1, 5000)
    a = RegionClaimer(r, keys, "eu")
    assert len(a.claim(T0 + 1, EXPIRY, batch=100, max_holds=100).claims) == 2
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=3)
    assert len(a.claim(T0 + 1, EXPIRY, batch=100, max_holds=100).claims) == 3  # w2's slots
    for job in ids[:5]:
        finished(r, keys, store, job, T0 + 2)
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=1)  # restarted
    r.hset(keys.worker("w1"), "stuck", "1")  # one probe thread past its deadline
    assert len(a.claim(T0 + 2, EXPIRY, batch=100, max_holds=100).claims) == 2  # 1 + 1, not 5
    assert len(leased(r, keys)) == 2
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=4)
    assert len(a.claim(T0 + 2, EXPIRY, batch=100, max_holds=100).claims) == 3
    assert len(leased(r, keys)) == 5
    # every slot taken by the cache's count: a larger concurrency is read before giving up
    register_fake_worker(r, keys, "w2", region="eu", role="shared", concurrency=6)
    assert len(a.claim(T0 + 2, EXPIRY, batch=100, max_holds=100).claims) == 2
    assert len(leased(r, keys)) == 7


def test_a_cached_claim_follows_a_rate_limit_set_or_cleared_since(r, keys, store):
    ids = make_jobs(store, r, keys, 6)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10)
    a = RegionClaimer(r, keys, "eu")
    assert a.claim(T0 + 1, EXPIRY, batch=10, max_holds=100).claims == []  # nothing ready yet
    version = r.get(keys.claim_tenants_version())
    set_rate_limit(r, keys, "acme", per_minute=1 * P, burst=2 * P)
    assert r.get(keys.claim_tenants_version()) != version
    promote_due(r, keys, T0 + 1, 5000)
    got = a.claim(T0 + 1, EXPIRY, batch=10, max_holds=100)
    assert [c.job_id for c in got.claims] == ids[:2] and got.rate_limited == 4
    clear_rate_limit(r, keys, "acme")  # the held jobs go back at the next claim, unlimited
    assert sorted(c.job_id for c in a.claim(T0 + 2, EXPIRY, batch=10, max_holds=100).claims) == (
        sorted(ids[2:])
    )


def test_held_jobs_another_claimer_held_are_released_by_a_warm_claimer(r, keys, store):
    """Claimer B (a worker's refill) holds acme's jobs; claimer A (beat) read the held tenants
    before that: the held set's change moves the version, so A offers their release."""
    ids = make_jobs(store, r, keys, 3)
    set_rate_limit(r, keys, "acme", per_minute=1 * P, burst=1 * P)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10)
    a, b = RegionClaimer(r, keys, "eu"), RegionClaimer(r, keys, "eu")
    assert a.claim(T0 - 50, EXPIRY, batch=10, max_holds=100).claims == []  # A's cache: none held
    promote_due(r, keys, T0 + 1, 5000)
    got = b.claim(T0 + 1, EXPIRY, batch=10, max_holds=100)
    assert [c.job_id for c in got.claims] == ids[:1] and got.rate_limited == 2
    assert r.smembers(keys.held_tenants("eu")) == {"acme"}
    # a minute on, acme has one token again: A, with nothing ready, releases its oldest held job
    later = a.claim(T0 + 61, T0 + 120, batch=10, max_holds=100)
    assert [c.job_id for c in later.claims] == ids[1:2]
