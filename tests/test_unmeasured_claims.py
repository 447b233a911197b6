"""A check whose cost was never measured may be slow: its first run takes a shared slot (slow
queue and lease), never a slot reserved for the fast lane, and keeps its fast-index order."""

from __future__ import annotations

import pytest
from support.checks import learned, register_fake_worker
from support.partitions import first_partition_names

from celery_app.checks.claiming import MIN_READ
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.redis.clock import server_time
from celery_app.redis.schema import JobField
from scheduling_core import LANE_FAST, LANE_SLOW

pytestmark = pytest.mark.app_settings(regions=["eu"], pool_size=2, fast_lane_reserved=1)

#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def _create(r, keys, app, uid: str, *, measured: bool, at: float) -> None:
    store = CheckStore(r, keys, settings_of(app))
    store.create(uid=U(uid), tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"])
    if measured:
        learned(r, keys, store.params, J(uid), scheduled_at=at, cost_ms=10.0)
    else:  # a new job, due at ``at`` (its WFQ order too), with no run behind it
        r.zadd(keys.due(), {J(uid): at})
        r.hset(
            keys.job(J(uid)),
            mapping={JobField.SCHEDULED_AT: repr(at), JobField.EFFECTIVE_AT: repr(at)},
        )


def test_unmeasured_jobs_take_only_shared_slots_and_measured_fast_ones_the_reserved(
    r, keys, app, broker
):
    now = server_time(r) + 100.0
    _create(r, keys, app, "new1", measured=False, at=now - 3)
    _create(r, keys, app, "new2", measured=False, at=now - 2)
    _create(r, keys, app, "known", measured=True, at=now - 1)
    register_fake_worker(r, keys, "f", region="eu", role="fast", concurrency=1)
    register_fake_worker(r, keys, "s", region="eu", role="shared", concurrency=1)
    claims = Dispatcher(app, client=r).tick(now).claims
    # FIFO among the new ones: new1 gets the shared slot, new2 waits; the reserved slot goes to
    # the measured fast check behind them, not to new2
    assert [(c.job_id, c.lane) for c in claims] == [(J("new1"), LANE_SLOW), (J("known"), LANE_FAST)]
    assert r.zscore(keys.leases("eu", LANE_SLOW), J("new1")) is not None
    assert r.zscore(keys.ready("eu", LANE_FAST), J("new2")) is not None
    assert broker.llen("checks.eu.slow") == 1 and broker.llen("checks.eu.fast") == 1


def test_measured_fast_job_behind_more_new_jobs_than_a_read_still_gets_the_reserved_slot(
    r, keys, app, broker
):
    # more new jobs at the head of the fast index than one claim round reads (MIN_READ), all
    # waiting for the one shared slot: the measured fast job behind them is still found
    now = server_time(r) + 100.0
    news = [f"new{i:02d}" for i in range(MIN_READ + 8)]
    for i, uid in enumerate(news):
        _create(r, keys, app, uid, measured=False, at=now - 100 + i * 0.01)
    _create(r, keys, app, "known", measured=True, at=now - 1)
    register_fake_worker(r, keys, "f", region="eu", role="fast", concurrency=1)
    register_fake_worker(r, keys, "s", region="eu", role="shared", concurrency=1)
    claims = Dispatcher(app, client=r).tick(now).claims
    assert [(c.job_id, c.lane) for c in claims] == [
        (J("new00"), LANE_SLOW),
        (J("known"), LANE_FAST),
    ]
    assert r.zcard(keys.ready("eu", LANE_FAST)) == len(news) - 1
