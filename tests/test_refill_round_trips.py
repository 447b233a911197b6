"""A refill's round trips: none when only work due within the lead exists (beat's dispatcher
takes it), three when work waits (the due ids with the region's state, the promote with the
candidates, the claim); and never more claims than free slots nor a job twice when refillers
race."""

from __future__ import annotations

import pytest
import redis
from support.at_once import at_once
from support.checks import learned, register_fake_worker
from support.partitions import first_partition_names
from support.round_trips import counting_client, preload_scripts, state_round_trips

from celery_app.checks.claiming import promote_due
from celery_app.checks.dispatch import PROMOTE_BATCH, Dispatcher, RefillNeeds
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.redis.clock import server_time
from celery_app.redis.scripts import _script

SCRIPTS = ("due", "promote", "top", "claim")


pytestmark = pytest.mark.app_settings(regions=["eu"], dispatch_lead=0.5)

#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def _checks(r, keys, app, uids: list[str], scheduled_at: float) -> None:
    store = CheckStore(r, keys, settings_of(app))
    for uid in uids:
        store.create(
            uid=U(uid), tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"]
        )
        learned(r, keys, store.params, J(uid), scheduled_at=scheduled_at)


def _needs(r, keys) -> RefillNeeds:
    """The refill's reads as the post-exec write carries them (not counted: not the refill's)."""
    needs = RefillNeeds(keys, "eu")
    pipe = r.pipeline(transaction=False)
    needs.prefetch(pipe)
    needs.prefetched(pipe.execute())
    return needs


def test_a_refill_with_only_lead_work_makes_no_round_trip_and_claims_nothing(
    r, keys, app, broker, redis_url
):
    now = server_time(r)
    _checks(r, keys, app, ["soon"], now + 0.3)  # inside the 0.5 s lead, not due yet
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2)
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.claim(now, ("eu",))  # the claimer learns the region's workers (as after a run)
    sends.clear()
    assert dispatcher.refill("eu", needs=_needs(r, keys)) == ()
    assert sends == []
    assert r.zscore(keys.due(), J("soon")) is not None  # left for beat's lead claim


def test_a_refill_of_due_work_makes_three_round_trips(r, keys, app, broker, redis_url):
    now = server_time(r)
    _checks(r, keys, app, ["late"], now - 0.3)  # due, waiting for a slot
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    preload_scripts(r, *SCRIPTS)
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.claim(now, ("eu",))
    sends.clear()
    claims = dispatcher.refill("eu", needs=_needs(r, keys))
    assert [c.job_id for c in claims] == [J("late")]
    # due ids + state; promote + candidates; the claim (no lead claim: no slot left)
    assert len(state_round_trips(sends)) == 3
    assert r.zscore(keys.leases("eu", claims[0].lane), J("late")) is not None


def test_a_refill_of_work_promoted_meanwhile_skips_the_promote(r, keys, app, broker, redis_url):
    now = server_time(r)
    _checks(r, keys, app, ["ready"], now + 0.3)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    preload_scripts(r, *SCRIPTS)
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.claim(now, ("eu",))
    # beat promoted it and claimed nothing (no slot was free then)
    promote_due(r, keys, now + 0.5, PROMOTE_BATCH)
    needs = _needs(r, keys)  # says: ready work waits
    sends.clear()
    assert [c.job_id for c in dispatcher.refill("eu", needs=needs)] == [J("ready")]
    promote_sha = _script("promote").sha.encode()
    assert not any(promote_sha in s for s in sends)
    assert len(state_round_trips(sends)) == 3


def test_racing_refills_never_exceed_the_free_slots_nor_take_a_job_twice(
    r, keys, app, broker, redis_url
):
    """Four refillers whose reads all said 'work waits' run at once, round after round, on one
    region with 3 slots of which some are still in flight."""
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=3)
    clients = [redis.Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    dispatchers = [Dispatcher(app, client=c) for c in clients]
    seen: set[str] = set()
    for round_ in range(6):
        in_flight = r.zcard(keys.leases("eu", 0)) + r.zcard(keys.leases("eu", 1))
        _checks(r, keys, app, [f"r{round_}j{i}" for i in range(5)], server_time(r) - 0.1)
        needs = [_needs(r, keys) for _ in dispatchers]
        got = _at_once(dispatchers, needs)
        ids = [c.job_id for batch in got for c in batch]
        assert len(ids) == len(set(ids)) and not seen & set(ids), "a job was claimed twice"
        seen.update(ids)
        assert len(ids) == 3 - in_flight  # every free slot filled, none over
        leased = r.zrange(keys.leases("eu", 0), 0, -1) + r.zrange(keys.leases("eu", 1), 0, -1)
        assert len(leased) == 3
        if round_ % 2 == 0:  # free the slots of this round's runs (their leases end)
            for job in ids:
                r.zrem(keys.leases("eu", 0), job)
                r.zrem(keys.leases("eu", 1), job)
    for c in clients:
        c.close()


def _at_once(dispatchers: list[Dispatcher], needs: list[RefillNeeds]) -> list[list]:
    return at_once(
        [
            lambda d=d, n=n: list(d.refill("eu", needs=n))
            for d, n in zip(dispatchers, needs, strict=True)
        ]
    )
