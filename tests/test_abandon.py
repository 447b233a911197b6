"""``abandon.lua`` through ``checks.abandon.abandon_run``: a run that raised before its probe gives
its lease back and its job goes to its next tick, at once, once, and only while the lease is
its own (real Redis, the real dispatcher's claim and the worker's real start read).

The worker side (the task raising, the signal, the log line and the metric) is in
test_worker_run_failures.py.
"""

from __future__ import annotations

import json

import pytest
from support.checks import at, register_fake_worker
from support.completion import finish
from support.partitions import pinned, suite_partitions

from celery_app.checks.abandon import Abandoned, abandon_run
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.checks.start_read import read_start
from celery_app.redis.clock import server_time
from celery_app.redis.schema import job_id
from scheduling_core import LANE_FAST, LANE_SLOW

#: c1, in the first partition of the check half (the one ``keys`` and the dispatcher read)
UID = pinned(suite_partitions(), "c1")
JOB = job_id(UID, "eu")
PERIOD = 10


@pytest.fixture
def claimed(r, keys, store, dispatcher_app) -> tuple[Dispatcher, str, float]:
    """``JOB`` claimed by the real dispatcher at Redis's time: (dispatcher, lease token, tick)."""
    now = server_time(r)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    store.create(uid=UID, tenant="t", kind="testprobe", target="x", period=PERIOD,
                 regions=["eu"], now=at(now - 3 * PERIOD))  # fmt: skip
    d = Dispatcher(dispatcher_app, client=r)
    (claim,) = [c for c in d.tick(now).claims if c.job_id == JOB]
    return d, claim.lease_token, claim.scheduled_at


def leased(r, keys) -> int:
    return r.zcard(keys.leases("eu", LANE_FAST)) + r.zcard(keys.leases("eu", LANE_SLOW))


def abandon(r, store, token: str, tick: float, task_id: str = "celery-1", **kw):
    return abandon_run(r, store.keys, store.params, JOB, token, task_id, scheduled_at=tick, **kw)


def test_the_lease_is_released_and_the_job_placed_at_its_next_tick_once(
    r, keys, store, claimed, cli
):
    _d, token, tick = claimed
    before = read_job(r, keys, JOB)
    ahead = server_time(r)
    done = abandon(r, store, token, tick)
    behind = server_time(r)

    assert done.result == Abandoned.RELEASED and done.lane == before.lane
    job = read_job(r, keys, JOB)
    # its next aligned tick after now on Redis's clock, as a completion places it: not the
    # claimed tick (lost), not a later one
    assert ahead < job.scheduled_at <= behind + PERIOD
    earliest, latest = (before.next_scheduled_at(at(t), tick).timestamp() for t in (ahead, behind))
    assert round(earliest, 3) <= job.scheduled_at <= round(latest, 3)
    assert job.scheduled_at == done.next_scheduled_at
    assert r.zscore(keys.due(), JOB) == pytest.approx(job.scheduled_at)
    assert job.effective_scheduled_at == pytest.approx(job.scheduled_at)  # no cost: no offset
    assert job.lease_token is None and job.lease_expiry is None and leased(r, keys) == 0
    # counted as a lost tick, not as a run (nothing was probed or recorded)
    assert (job.abandoned, job.runs) == (1, before.runs)
    assert r.xlen(keys.results(UID)) == 0

    # idempotent: a second call (a signal sent twice) finds the lease gone
    assert abandon(r, store, token, tick).result == Abandoned.LEASE_GONE
    assert read_job(r, keys, JOB).abandoned == 1
    # an operator sees the lost tick beside the runs
    (shown,) = json.loads(cli("show", UID, "--json"))["jobs"]
    assert (shown["runs"], shown["abandoned_before_probe"]) == (before.runs, 1)
    assert "abandoned=1" in cli("show", UID)


def test_a_clock_behind_the_claimed_tick_still_places_the_job_after_it(r, keys, store, claimed):
    _d, token, tick = claimed
    done = abandon(r, store, token, tick, now=tick - 5 * PERIOD)
    assert done.result == Abandoned.RELEASED
    assert read_job(r, keys, JOB).scheduled_at == pytest.approx(tick + PERIOD)


def test_ticks_passed_before_a_late_abandonment_are_counted_too(r, keys, store, claimed, cli):
    """A run that raises before its probe long after its tick (its start read retried through
    a failover): the claimed tick is abandoned, the ticks after it that passed are counted as
    passed over, so runs + abandoned + passed still account for the ticks due."""
    _d, token, tick = claimed
    assert abandon(r, store, token, tick, now=tick + 2.5 * PERIOD).result == Abandoned.RELEASED
    job = read_job(r, keys, JOB)
    assert job.scheduled_at == pytest.approx(tick + 3 * PERIOD)
    assert (job.abandoned, job.passed) == (1, 2)
    assert "abandoned=1 passed=2" in cli("show", UID)


def test_a_reaper_or_a_completion_that_got_there_first_wins(r, keys, store, claimed):
    d, token, tick = claimed
    assert d.reap(server_time(r) + 3600) == 1  # the lease expired: recorded as a lost run
    reaped = read_job(r, keys, JOB)
    assert abandon(r, store, token, tick).result == Abandoned.LEASE_GONE
    assert read_job(r, keys, JOB) == reaped  # nothing written

    (again,) = d.tick(reaped.scheduled_at).claims
    assert finish(r, keys, store.settings, JOB, again.lease_token)[0]
    done = read_job(r, keys, JOB)
    assert abandon(r, store, again.lease_token, again.scheduled_at).result == Abandoned.LEASE_GONE
    assert read_job(r, keys, JOB) == done and done.abandoned == 0


def test_only_the_delivery_that_started_the_lease_may_abandon_it(r, keys, store, claimed):
    _d, token, tick = claimed
    # the delivery "celery-1" read its start (and took the started marker): it is probing
    assert read_start(r, keys, JOB, UID, token, "celery-1", 60_000).first_delivery
    # another delivery of the same lease whose start read failed must not free its slot
    assert abandon(r, store, token, tick, task_id="celery-2").result == Abandoned.STARTED_ELSEWHERE
    assert read_job(r, keys, JOB).lease_token == token and leased(r, keys) == 1
    # the run that took the marker (its start read set it, then raised) may
    assert abandon(r, store, token, tick, task_id="celery-1").result == Abandoned.RELEASED
    assert leased(r, keys) == 0


def test_a_disabled_check_is_released_but_not_placed(r, keys, store, claimed):
    _d, token, tick = claimed
    store.set_enabled(UID, False)
    assert read_job(r, keys, JOB).lease_token == token  # a disable leaves a running run be
    assert abandon(r, store, token, tick).result == Abandoned.RELEASED
    assert r.zscore(keys.due(), JOB) is None and leased(r, keys) == 0
