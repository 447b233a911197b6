"""Starting on the tick: the dispatcher's wake-up and the worker's wait (scheduling_core.on_tick),
and the claim made ahead of a tick (lead, lease from the tick, the next due instant)."""

from __future__ import annotations

import pytest
from support.checks import learned, register_fake_worker
from support.partitions import first_partition_names

from celery_app.checks.dispatch import Dispatcher, TickReport
from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import lease_seconds
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from scheduling_core.on_tick import MAX_LEAD_S, dispatch_wait, tick_wait

T0 = 1_780_000_000.0


def test_dispatch_wait_wakes_when_the_next_job_enters_the_lead():
    assert dispatch_wait(100.0, 100.3, 0.05, 0.5) == pytest.approx(0.25)
    assert dispatch_wait(100.0, 105.0, 0.05, 0.5) == 0.5  # never longer than the interval
    assert dispatch_wait(100.0, None, 0.05, 0.5) == 0.5  # nothing due: the interval
    # a job just past the lead: not before half a lead (batches, no wake per job)
    assert dispatch_wait(100.0, 100.051, 0.05, 0.5) == pytest.approx(0.025)


def test_tick_wait_uses_a_lower_bound_of_the_server_time_and_is_bounded():
    # server said 10.0, 0.004 s ago: it is at least 10.004 now, so 0.046 s remain to 10.05
    assert tick_wait(10.05, 10.0, 0.004) == pytest.approx(0.046)
    assert tick_wait(9.0, 10.0, 0.0) == 0.0  # due already: no wait
    assert tick_wait(1e9, 10.0, 0.0) == MAX_LEAD_S  # a bogus far tick never parks a slot long


pytestmark = pytest.mark.app_settings(regions=["eu"], dispatch_lead=0.2)
#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def _check(r, keys, app, uid: str, scheduled_at: float) -> None:
    store = CheckStore(r, keys, settings_of(app))
    store.create(
        uid=U(uid), tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"]
    )  # fmt: skip
    learned(r, keys, store.params, J(uid), scheduled_at=scheduled_at)


def test_a_job_due_within_the_lead_is_claimed_with_its_lease_from_its_tick(r, keys, app, broker):
    _check(r, keys, app, "soon", T0 + 0.15)  # inside the 0.2 s lead
    _check(r, keys, app, "later", T0 + 0.3)  # outside it
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    dispatcher = Dispatcher(app, client=r)
    report = dispatcher.tick(T0)
    assert [c.job_id for c in report.claims] == [J("soon")]
    settings = settings_of(app)
    lease_s = lease_seconds(dispatcher.params, settings.lease_margin)
    job = read_job(r, keys, J("soon"))
    # the worker waits until the tick, so the lease (and the reaper's patience) starts there
    assert job.lease_expiry == pytest.approx(T0 + 0.15 + lease_s, abs=1e-5)
    assert report.next_due == pytest.approx(T0 + 0.3)
    # beat runs again when "later" enters the lead: 0.1 s from now
    assert dispatcher.next_wait(report) == pytest.approx(0.1)


def test_a_due_job_keeps_its_lease_from_the_claim(r, keys, app, broker):
    _check(r, keys, app, "late", T0 - 2.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    dispatcher = Dispatcher(app, client=r)
    (_claim,) = dispatcher.tick(T0).claims
    settings = settings_of(app)
    lease_s = lease_seconds(dispatcher.params, settings.lease_margin)
    assert read_job(r, keys, J("late")).lease_expiry == pytest.approx(T0 + lease_s, abs=1e-5)
    assert dispatcher.next_wait(TickReport(now=T0)) == settings.dispatch_interval


def test_no_slot_waits_for_a_tick_while_due_work_waits(r, keys, app, broker):
    _check(r, keys, app, "overdue", T0 - 1.0)
    _check(r, keys, app, "soon", T0 + 0.1)  # inside the lead
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    dispatcher = Dispatcher(app, client=r)
    assert [c.job_id for c in dispatcher.tick(T0).claims] == [J("overdue")]
    # the due job got the only slot, and the one not yet due was not even promoted
    assert r.zscore(keys.due(), J("soon")) is not None


def test_a_refill_takes_what_waits_and_leaves_the_lead_to_beat(r, keys, app, broker):
    from celery_app.redis.clock import server_time

    now = server_time(r)
    _check(r, keys, app, "overdue", now - 1.0)
    _check(r, keys, app, "soon", now + 0.15)  # inside the 0.2 s lead
    _check(r, keys, app, "later", now + 30.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    dispatcher = Dispatcher(app, client=r)
    # due work waits: the refill claims it, then (slots left) the lead's job after it
    assert [c.job_id for c in dispatcher.refill("eu")] == [J("overdue"), J("soon")]
    _check(r, keys, app, "soon2", server_time(r) + 0.15)
    # only work due within the lead: beat's, which wakes for it; the refill claims nothing
    assert dispatcher.refill("eu") == ()
    assert r.zscore(keys.due(), J("soon2")) is not None
    assert r.zscore(keys.due(), J("later")) is not None


def test_a_lead_claim_on_a_server_without_its_scripts_still_takes_what_it_promoted(
    r, keys, app, broker
):
    """The lead's promote and the claim's candidates share a pipeline: on a server without the
    scripts the promote got NOSCRIPT and ran again after the candidates were read, so the claim
    missed the job it had just promoted, and that job (no longer in the due index) waited for
    beat's next planned wake-up. The claim now reads its candidates again after such a re-run."""
    _check(r, keys, app, "soon", T0 + 0.15)  # inside the 0.2 s lead
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    dispatcher = Dispatcher(app)  # checkbeat's own client: pipelines queue bare EVALSHAs
    r.script_flush()  # a restarted server: no script loaded
    assert [c.job_id for c in dispatcher.tick(T0).claims] == [J("soon")]
