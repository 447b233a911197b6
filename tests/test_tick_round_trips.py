"""Beat's dispatcher tick under spare capacity: when nothing came due since the last tick (it woke
as a job entered the lead), one round promotes the lead's jobs and claims them with what waits in
the ready indexes, reading each region's state and candidates once; when something is due, it is
claimed first and the lead's jobs only with the slots left. The due index is read once a tick;
the late heartbeats only when the tick moved one there, or once an interval."""

from __future__ import annotations

import pytest
from support.checks import learned, register_fake_worker
from support.partitions import first_partition_names
from support.round_trips import counting_client, preload_scripts, state_round_trips

from celery_app.checks.check_state import read_transitions
from celery_app.checks.claiming import promote_due
from celery_app.checks.dispatch import PROMOTE_BATCH, Dispatcher
from celery_app.checks.jobs import from_unix
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.redis.clock import server_time
from celery_app.redis.scripts import _script

pytestmark = pytest.mark.app_settings(regions=["eu"], dispatch_lead=0.5)

#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def _checks(r, keys, app, at: dict[str, float]) -> None:
    store = CheckStore(r, keys, settings_of(app))
    for uid, scheduled_at in at.items():
        store.create(
            uid=U(uid), tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"]
        )
        learned(r, keys, store.params, J(uid), scheduled_at=scheduled_at)


def _count(sends: list[bytes], marker: bytes) -> int:
    """Commands of ``sends`` naming ``marker`` (redis-py's own SCRIPT EXISTS aside)."""
    return sum(s.count(marker) for s in state_round_trips(sends))


def test_a_tick_with_nothing_due_claims_the_lead_and_what_waits_reading_each_once(
    r, keys, app, broker, redis_url
):
    now = server_time(r)
    _checks(r, keys, app, {"waits": now - 5, "soon": now + 0.3})
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    preload_scripts(r, "due", "promote", "top", "claim")
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.claim(now - 10, ("eu",))  # the claimer learns the region's workers
    promote_due(r, keys, now, PROMOTE_BATCH)  # "waits" is ready, left unclaimed: nothing is due
    sends.clear()
    report = dispatcher.tick(now)
    assert sorted(c.job_id for c in report.claims) == sorted([J("waits"), J("soon")])
    assert _count(sends, b"SCARD") == 1  # the region's state, read once
    assert _count(sends, _script("top").sha.encode()) == 1  # its candidates, read once
    assert _count(sends, _script("due").sha.encode()) == 1  # due now and within the lead at once
    assert r.zcard(keys.due()) == 0 and r.zcard(keys.ready("eu", 0)) == 0


def test_a_tick_claims_what_is_due_before_the_lead(r, keys, app, broker, redis_url):
    now = server_time(r)
    _checks(r, keys, app, {"soon": now + 0.1, "due": now - 0.2})
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    dispatcher = Dispatcher(app)
    dispatcher.claim(now - 10, ("eu",))
    assert [c.job_id for c in dispatcher.tick(now).claims] == [J("due")]  # the one slot
    assert r.zscore(keys.due(), J("soon")) is not None  # the lead's job waits in the due index


def test_a_tick_claims_due_work_then_the_lead_with_the_slots_left(r, keys, app, broker, redis_url):
    now = server_time(r)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2)
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.tick(now - 0.01)  # the interval's upkeep; the claimer learns the region's workers
    _checks(r, keys, app, {"soon": now + 0.1, "due": now - 0.2})
    sends.clear()
    report = dispatcher.tick(now)
    assert [c.job_id for c in report.claims] == [J("due"), J("soon")]
    assert _count(sends, b"SCARD") == 2  # the due round claimed: the lead's reads the state again
    # the first round's promote saw "soon" still due; the lead's round promoted it since
    assert report.next_due is None


def test_a_tick_reads_the_next_due_job_on_its_promote_round_trip(r, keys, app, broker, redis_url):
    now = server_time(r)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    preload_scripts(r, "due", "promote", "top", "claim")
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.tick(now)  # the interval's upkeep, and the claimer learns the region's workers
    _checks(r, keys, app, {"soon": now + 0.3, "later": now + 30})
    sends.clear()
    report = dispatcher.tick(now + 0.01)
    assert [c.job_id for c in report.claims] == [J("soon")]
    assert report.next_due == pytest.approx(now + 30, abs=0.002)
    trips = state_round_trips(sends)
    # the due ids with the state; the promote, the next due job and the candidates; the claim
    assert len(trips) == 3, trips
    promote = _script("promote").sha.encode()
    assert [t for t in trips if b"ZRANGE" in t and promote not in t] == []


def _late_reads(sends: list[bytes], keys) -> int:
    """Reads of the late heartbeats index (not ``promote.lua`` declaring it among its keys)."""
    late = keys.heartbeats_late().encode()
    return sum(1 for s in state_round_trips(sends) if b"ZRANGEBYSCORE" in s and late in s)


def test_a_tick_reads_the_late_heartbeats_only_when_it_moved_one_there_or_for_its_upkeep(
    r, keys, app, broker, redis_url
):
    now = server_time(r)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    dispatcher.tick(now)  # the first tick is also the interval's upkeep
    assert _late_reads(sends, keys) == 1
    _checks(r, keys, app, {"later": now + 0.4})
    sends.clear()
    assert [c.job_id for c in dispatcher.tick(now + 0.01).claims] == [J("later")]
    assert _late_reads(sends, keys) == 0  # within the interval, no heartbeat moved: not read
    CheckStore(r, keys, settings_of(app)).create(
        uid=U("beat"), tenant="acme", kind="heartbeat", target="a job", period=1,
        regions=["eu"], failure_threshold=1, config={"grace": 0},
        now=from_unix(now - 30),
    )  # fmt: skip  # its deadline passed: due
    sends.clear()
    dispatcher.tick(now + 0.02)
    assert _late_reads(sends, keys) == 1  # moved to the late index by this tick: recorded now
    moves = [(t["from"], t["to"]) for t in read_transitions(r, keys.check_transitions(U("beat")))]
    assert moves == [("up", "down")]
