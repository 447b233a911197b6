"""Beat's sleep is cut short when the check store writes a tick (``beat.dispatch_wake``): a check
created while beat sleeps (up to ``CHECKBEAT_DISPATCH_INTERVAL``) is claimed on its first tick,
not at beat's planned wake-up."""

from __future__ import annotations

import logging
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.checks import register_fake_worker
from support.polling import wait_for
from support.processes import Processes

from beat.dispatch_wake import MIN_WAKE_GAP_S, WakeListener
from celery_app.checks.store import CheckStore
from celery_app.errors import CheckExists
from celery_app.redis.clock import server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import JobField
from celery_app.settings import load_settings


def _subscribers(r: redis.Redis, channel: str) -> int:
    counts = {k.encode() if isinstance(k, str) else k: n for k, n in r.pubsub_numsub(channel)}
    return counts.get(channel.encode(), 0)


def _listening(r: redis.Redis, waker: WakeListener, channel: str) -> None:
    waker._subscribed()
    wait_for(lambda: _subscribers(r, channel) == 1, 10, what="the subscription")


def test_a_wait_returns_at_once_on_a_message_and_sleeps_its_time_without(r, keys):
    channel = keys.dispatch_wake()
    waker = WakeListener(r, [channel])
    try:
        _listening(r, waker, channel)
        started = time.monotonic()
        assert waker.wait(0.3) is False
        assert time.monotonic() - started >= 0.3
        pipe = r.pipeline(transaction=False)  # two writes' wake-ups, sent together ...
        pipe.publish(channel, "")
        pipe.publish(channel, "")
        pipe.execute()  # ... both drained by one wake-up
        started = time.monotonic()
        assert waker.wait(30) is True
        assert time.monotonic() - started < 5
        assert waker.wait(0.05) is False
    finally:
        waker.close()
    assert wait_for(lambda: _subscribers(r, channel) == 0, 10, what="the unsubscription")


def test_a_stream_of_writes_wakes_beat_at_most_every_min_gap(r, keys):
    channel = keys.dispatch_wake()
    waker = WakeListener(r, [channel])
    try:
        _listening(r, waker, channel)
        r.publish(channel, "")
        assert waker.wait(30) is True
        woke = time.monotonic()
        r.publish(channel, "")
        assert waker.wait(30) is True
        assert time.monotonic() - woke >= MIN_WAKE_GAP_S  # batched, not one tick per write
        assert waker.wait(0.05) is False  # what came during the gap was drained
    finally:
        waker.close()


def test_a_broken_subscription_sleeps_instead_and_subscribes_again(r, keys, caplog, monkeypatch):
    logger = logging.getLogger("beat.dispatch_wake")
    monkeypatch.setattr(logger, "disabled", False)  # a Celery app of another test may disable it
    caplog.set_level(logging.WARNING, logger=logger.name)
    dead = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    waker = WakeListener(dead, [keys.dispatch_wake()])
    started = time.monotonic()
    assert waker.wait(0.2) is False  # no exception: a plain sleep
    assert time.monotonic() - started >= 0.2
    assert waker.wait(0.1) is False
    warnings = [m for m in caplog.messages if "wake-ups unavailable" in m]
    assert len(warnings) == 1  # said once, not at every wait
    waker.client = r  # the server is back: the next wait subscribes again
    _listening(r, waker, keys.dispatch_wake())
    r.publish(keys.dispatch_wake(), "")
    assert waker.wait(30) is True
    waker.close()


@pytest.mark.parametrize("write", ["create", "create_many", "update", "delete"])
def test_every_write_of_the_store_wakes_the_dispatcher(r, keys, store, test_kind, write):
    channel = keys.of_check("w1").dispatch_wake()  # its partition's dispatcher
    fields = dict(uid="w1", tenant="acme", kind=test_kind, target="x", period=60)
    if write in ("update", "delete"):
        store.create(**fields)
    waker = WakeListener(r, [channel])
    try:
        _listening(r, waker, channel)
        if write == "create":
            store.create(**fields)
        elif write == "create_many":
            from celery_app.checks.definition import validate_definition

            store.create_many([validate_definition(store.settings, **fields)])
        elif write == "update":
            store.update("w1", period=120)
        else:
            store.delete("w1")
        assert waker.wait(10) is True
    finally:
        waker.close()


def test_a_refused_write_wakes_no_one(r, keys, store, test_kind):
    """The publish is part of the write's own ``store.lua`` call: a batch refused (here: the
    uid is taken) writes nothing and publishes nothing."""
    channel = keys.of_check("w1").dispatch_wake()  # its partition's dispatcher
    fields = dict(uid="w1", tenant="acme", kind=test_kind, target="x", period=60)
    store.create(**fields)
    subscriber = r.pubsub(ignore_subscribe_messages=True)
    try:
        subscriber.subscribe(channel)
        wait_for(lambda: _subscribers(r, channel) == 1, 10, what="the subscription")
        with pytest.raises(CheckExists):
            store.create(**fields)
        store.update("w1", period=120)  # a write that lands after it: the only message
        messages = []
        wait_for(
            lambda: messages.append(subscriber.get_message(timeout=0.1)) or any(messages),
            10,
            what="the update's wake-up",
        )
        assert len([m for m in messages if m]) == 1
        assert subscriber.get_message(timeout=0.2) is None
    finally:
        subscriber.close()


def test_a_check_created_while_beat_sleeps_is_claimed_on_its_first_tick(
    tmp_path, r, broker, redis_url, broker_url, test_kind
):
    """Beat sleeps 15 s (nothing due; a 30 s dispatch interval); the check's first tick comes
    within its 2 s period. Without the wake-up it would be claimed up to 15 s late."""
    settings = load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=["eu"]
    )
    keys = state_keys(settings)
    store = CheckStore(r, keys, settings)
    keys = keys.of_check("fresh")  # its partition's worker share, wake-ups and dispatcher
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2, ttl=120)
    procs = Processes(tmp_path)
    try:
        procs.celery(
            "beat", "beat", "-l", "INFO", "--pidfile=", "-s", str(tmp_path / "schedule"),
            CHECKBEAT_REGIONS="eu", CHECKBEAT_DISPATCH_INTERVAL="30",
        )  # fmt: skip
        wait_for(
            lambda: _subscribers(r, keys.dispatch_wake()) >= 1,
            30,
            what=f"beat listening for wake-ups\n{procs.output('beat')}",
        )
        store.create(uid="fresh", tenant="acme", kind=test_kind, target="x", period=2)
        tick = float(r.hget(keys.job("fresh@eu"), JobField.SCHEDULED_AT))
        assert tick - server_time(r) < 2.5
        claimed_at = wait_for(
            lambda: r.hget(keys.job("fresh@eu"), JobField.LEASE_TOKEN) and server_time(r),
            10,
            interval=0.005,
            what=f"the first run claimed\n{procs.output('beat')}",
        )
        # claimed within the lead before its tick, or just after it: not at beat's wake-up
        assert claimed_at - tick < 0.5, (claimed_at - tick, procs.output("beat"))
    finally:
        procs.stop()
