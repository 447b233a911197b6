"""The dispatcher's doorbell: a worker rings when it frees a slot, the dispatcher wakes."""

from __future__ import annotations

import threading
import time

from celery_app.keys import Keys
from celery_app.wakeup import ring, wait_for_ring

KEYS = Keys("cbtest")


def test_a_ring_wakes_the_waiting_dispatcher_at_once(r):
    threading.Timer(0.2, ring, args=(r, KEYS, "us")).start()
    started = time.monotonic()
    assert wait_for_ring(r, KEYS, ["eu", "us"], timeout=5.0)
    assert 0.15 < time.monotonic() - started < 2.0
    assert not r.exists(KEYS.slots_freed("us"))  # cleared for the next wait


def test_many_rings_are_one_wake_and_silence_times_out(r):
    for _ in range(5):
        ring(r, KEYS, "eu")
    assert r.llen(KEYS.slots_freed("eu")) == 1
    assert 0 < r.ttl(KEYS.slots_freed("eu")) <= 60
    assert wait_for_ring(r, KEYS, ["eu"], timeout=1.0)
    started = time.monotonic()
    assert not wait_for_ring(r, KEYS, ["eu"], timeout=0.2)
    assert time.monotonic() - started >= 0.15
