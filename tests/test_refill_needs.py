"""The refill's reads carried by another round trip (the post-exec write's): the same decision
as the refill's own read, and nothing claimed when they say nothing waits."""

from __future__ import annotations

import pytest
from support.checks import learned, register_fake_worker
from support.partitions import first_partition_names

from celery_app.checks.dispatch import Dispatcher, RefillNeeds
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.redis.clock import server_time

pytestmark = pytest.mark.app_settings(regions=["eu"], dispatch_lead=0.2)

#: Its checks share the first partition, the one its dispatcher and ``keys`` read.
U, J = first_partition_names()


def _check(r, keys, app, uid: str, scheduled_at: float) -> None:
    store = CheckStore(r, keys, settings_of(app))
    store.create(
        uid=U(uid), tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"]
    )  # fmt: skip
    learned(r, keys, store.params, J(uid), scheduled_at=scheduled_at)


def _needs_read_with(r, keys, other_key: str) -> RefillNeeds:
    """The needs queued after another read on one pipeline, as the post-exec write does."""
    needs = RefillNeeds(keys, "eu")
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(other_key)
    needs.prefetch(pipe)
    pipe.get("something-after")
    replies = pipe.execute()
    needs.prefetched(replies[1:])
    return needs


def test_prefetched_needs_leave_work_due_within_the_lead_to_beat(r, keys, app, broker):
    now = server_time(r)
    _check(r, keys, app, "soon", now + 0.15)  # inside the 0.2 s lead, not due yet
    _check(r, keys, app, "later", now + 30.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    dispatcher = Dispatcher(app, client=r)
    needs = _needs_read_with(r, keys, keys.job(J("soon")))
    assert needs.decide()[1] is False  # nothing waits: due, ready or held
    assert dispatcher.refill("eu", needs=needs) == ()
    assert r.zscore(keys.due(), J("soon")) is not None  # neither promoted nor claimed
    # beat's dispatcher, woken as "soon" enters the lead, claims it (and not "later")
    assert [c.job_id for c in dispatcher.tick().claims] == [J("soon")]
    assert r.zscore(keys.due(), J("later")) is not None


def test_prefetched_needs_see_due_work(r, keys, app, broker):
    now = server_time(r)
    _check(r, keys, app, "overdue", now - 1.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    needs = _needs_read_with(r, keys, keys.job(J("overdue")))
    claims = Dispatcher(app, client=r).refill("eu", needs=needs)
    assert [c.job_id for c in claims] == [J("overdue")]


def test_needs_without_their_replies_are_an_error(keys):
    with pytest.raises(RuntimeError, match="before its replies"):
        RefillNeeds(keys, "eu").decide()
