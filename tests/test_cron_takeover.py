"""Publish at least once: a claim whose claimer never confirmed it is taken over by one beat."""

from __future__ import annotations

import threading
from datetime import timedelta

from support.cron import T0, make_engine, sends, store_of

from celery_app.cron_tasks.cron_state import FireRequest
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks, window_id
from celery_app.redis.schema import CRON_CLAIM_LEASE_S, CronGapField, CronStatsField, Keys

KEYS = Keys("cbtest")
LEASE = timedelta(seconds=CRON_CLAIM_LEASE_S)


def _noop(tenant: str | None = None) -> None: ...


def _dead_claim(app, task_id: str, **options) -> FireRequest:
    """A beat took the window key of ``task_id`` at T0, then died before publishing."""
    cron("* * * * *", app=app, id=task_id, name=f"t.{task_id}", **options)(_noop)
    req = FireRequest(cron_tasks(app)[task_id], GLOBAL_TENANT, T0)
    claim = store_of(app).claim([req], now=T0, owner="beat:dead")
    assert list(claim) == [1]  # FIRE
    return req


def test_expired_claim_is_published_once_by_one_of_racing_beats(cron_app, broker_url, r):
    _dead_claim(cron_app, "half-done")
    engines = [make_engine(cron_app, owner=f"engine-{n}") for n in range(4)]
    # Within the lease the claimer may still publish: nobody takes it over.
    assert engines[0].take_over(T0 + LEASE - timedelta(seconds=1)).published == ()
    assert sends(broker_url) == {}

    at = T0 + LEASE + timedelta(seconds=1)
    barrier = threading.Barrier(len(engines))
    results = []

    def race(engine):
        barrier.wait(timeout=10)
        results.append(engine.take_over(at))

    threads = [threading.Thread(target=race, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(len(res.published) for res in results) == [0, 0, 0, 1]
    assert sends(broker_url) == {("half-done", GLOBAL_TENANT, window_id(T0)): 1}
    assert r.hlen(KEYS.cron_pending()) == 0
    assert r.zcard(KEYS.cron_pending_lease()) == 0
    assert r.hget(KEYS.cron_stats("half-done"), CronStatsField.TAKEN_OVER) == "1"
    # Confirmed claims are never taken over again.
    assert engines[0].take_over(at + 2 * LEASE).published == ()
    assert sends(broker_url) == {("half-done", GLOBAL_TENANT, window_id(T0)): 1}


def test_confirmed_claim_is_not_taken_over(cron_app, broker_url):
    cron("* * * * *", app=cron_app, id="fine", name="t.fine")(_noop)
    engine = make_engine(cron_app)
    assert [f.task_id for f in engine.tick(T0 + timedelta(seconds=1)).fired] == ["fine"]
    other = make_engine(cron_app, owner="engine-2")
    assert other.take_over(T0 + 3 * LEASE).published == ()
    assert sends(broker_url) == {("fine", GLOBAL_TENANT, window_id(T0)): 1}


def test_claim_found_after_its_deadline_is_a_gap_naming_the_claimer(cron_app, broker_url, r):
    _dead_claim(cron_app, "too-late")
    store = store_of(cron_app)
    late = T0 + timedelta(minutes=1) + store.grace + timedelta(seconds=1)
    taken = make_engine(cron_app, owner="engine-2").take_over(late)
    assert taken.published == ()
    assert taken.lost == (f"too-late|{GLOBAL_TENANT}|{window_id(T0)}",)
    assert sends(broker_url) == {}
    (gap,) = store.gaps()
    assert gap[CronGapField.TASK] == "too-late"
    assert gap[CronGapField.FROM] == T0.timestamp()
    assert gap[CronGapField.DETECTOR].startswith("claimed by beat:dead, never published")
    assert r.hlen(KEYS.cron_pending()) == 0


def test_taker_that_dies_too_is_taken_over_by_the_next(cron_app, broker_url):
    req = _dead_claim(cron_app, "twice-dead")
    store = store_of(cron_app)
    (batch,) = store.expired_claims(T0 + LEASE)
    # A second beat wins the claim, then dies before publishing: its lease ends as well.
    assert store.take_over(batch, T0 + LEASE) is not None
    survivor = make_engine(cron_app, owner="engine-3")
    assert survivor.take_over(T0 + LEASE + timedelta(seconds=1)).published == ()
    taken = survivor.take_over(T0 + 2 * LEASE + timedelta(seconds=1))
    assert taken.published == (req,)
    assert sends(broker_url) == {("twice-dead", GLOBAL_TENANT, window_id(T0)): 1}
