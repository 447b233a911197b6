"""A custom probe that ignores its deadline keeps its slot busy until its thread returns.

A real threads-pool worker (3 slots) runs a user kind that blocks on an Event the test holds.
The runner stops waiting at the deadline (the run is recorded as a timeout) but the thread runs
on: the worker reports one stuck slot in its capacity hash, and the claim gives the region one
slot fewer. When the test releases the Event the thread returns, the report goes back to 0 and
the claim has every slot again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.partitions import one_partition_only, suite_keys
from support.polling import wait_for

from celery_app.checks.capacity import read_capacity
from celery_app.checks.claiming import promote_due
from celery_app.checks.dispatch import PROMOTE_BATCH, Dispatcher
from celery_app.checks.jobs import from_unix, read_job
from celery_app.checks.kinds import check_kind, unregister_kind
from celery_app.checks.store import CheckStore
from celery_app.redis.clock import server_time
from celery_app.redis.schema import WorkerField, check_queue, job_id

KEYS = suite_keys("cbtest")
HOST = "stuck@t"
SLOTS = 3
REGION = "local"
QUEUES = [check_queue(REGION, "fast"), check_queue(REGION, "slow")]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """The ``hang`` kind blocks on this Event whatever its deadline says (released at the end)."""
    released = threading.Event()

    @check_kind("hang")
    def hang(target: str, config: dict) -> bool:
        released.wait(60)
        return True

    yield released
    released.set()
    unregister_kind("hang")


def stuck_reported(r) -> int:
    return int(r.hget(KEYS.worker(HOST), WorkerField.STUCK) or 0)


def claim_all(d: Dispatcher, r) -> int:
    """Promote and claim what the region's free slots allow (unpublished), then give it back:
    how many slots the claim found free."""
    now = server_time(r)
    promote_due(d.redis, d.keys, now, PROMOTE_BATCH)
    claims = d.claim(now).claims
    d.release(claims)
    return len(claims)


@pytest.mark.timeout(90)
@one_partition_only(
    "one dispatcher counts the worker's free slots; with partitions the stuck slot is taken "
    "from one partition's share (take_from_shares, tests/test_partition_shares.py)"
)
def test_a_stuck_probe_thread_holds_its_slot_until_it_returns(
    r, make_app, run_worker, test_kind, gate
):
    app = make_app(check_timeout=1.0)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    run_worker(app, QUEUES, concurrency=SLOTS, hostname=HOST)
    wait_for(lambda: r.exists(KEYS.worker(HOST)), 20, what="the worker's registration")
    assert read_capacity(r, KEYS, REGION).total == SLOTS
    assert stuck_reported(r) == 0

    due = from_unix(time.time() - 70)
    store.create(uid="hung", tenant="t", kind="hang", target="x", period=60, now=due)
    d = Dispatcher(app, client=r)
    wait_for(lambda: d.tick().claims, 10, what="the hanging check claimed and published")
    hung = job_id("hung", REGION)
    # the run ends at its deadline (a timeout), its thread does not: one slot reported stuck
    wait_for(lambda: read_job(r, KEYS, hung).runs == 1, 20, what="the hung run recorded")
    assert read_job(r, KEYS, hung).lease_token is None  # no lease counts the slot busy
    wait_for(lambda: stuck_reported(r) == 1, 10, what="the stuck slot reported")
    assert read_capacity(r, KEYS, REGION).total == SLOTS - 1

    # ready work for every slot and more: the claim takes one fewer than the worker has
    for i in range(SLOTS + 2):
        store.create(uid=f"q{i}", tenant="t", kind=test_kind, target="x", period=60, now=due)
    assert claim_all(d, r) == SLOTS - 1

    gate.set()  # the thread returns: its slot is free again
    wait_for(lambda: stuck_reported(r) == 0, 10, what="the stuck slot freed")
    assert read_capacity(r, KEYS, REGION).total == SLOTS
    assert claim_all(d, r) == SLOTS
