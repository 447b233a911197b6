"""End to end with a real Celery worker: what the dispatcher publishes is consumed and run."""

from __future__ import annotations

import json
import time

import pytest
from support.partitions import dispatchers, tick_all
from support.polling import wait_for

from celery_app.checks.jobs import from_unix, read_job
from celery_app.factory import create_app
from celery_app.publish import KombuBatchPublisher, RedisBatchPublisher, TaskMessage
from celery_app.redis.schema import check_queue

QUEUES = [check_queue("eu", "fast"), check_queue("eu", "slow")]


def build_app(settings):
    """A Celery app whose workers run the real ``checkbeat.run_check`` (workers.tasks, a built-in
    task module), plus an echo task for the publisher tests."""
    app = create_app(settings)
    seen: list[str] = []

    @app.task(name="cbtest.echo", shared=False)
    def echo(value: str) -> None:
        seen.append(value)

    return app, seen


@pytest.mark.timeout(60)
def test_dispatched_checks_run_on_a_real_worker_and_come_back_due(
    r, keys, settings, store, broker, run_worker
):
    app, _ = build_app(settings)
    now = time.time()
    for i in range(12):
        store.create(
            uid=f"w{i}",
            tenant="acme",
            kind="testprobe",
            target="x",
            period=60,
            regions=["eu"],
            now=from_unix(now - 70),
        )
    # every job is due: dispatch at a clock 70 s ahead of their creation, in every partition
    each = dispatchers(app, r)
    slots = max(4, keys.partitions)  # at least one slot in every partition
    run_worker(app, QUEUES, slots)
    # The real worker registers its slots itself (workers.worker_step), a share in every
    # partition.
    wait_for(
        lambda: all(r.scard(part.region_workers("eu")) == 1 for part in keys.every_partition()),
        20,
        what="registration",
    )
    # The worker refills the slots it frees (workers.post_exec -> refill_after_run), so
    # beat's ticks claim only part of the work; either way capacity is never exceeded.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not all(
        read_job(r, keys, f"w{i}@eu").runs == 1 for i in range(12)
    ):
        tick_all(each, now)
        # capacity: never more claimed and unfinished than the registered slots
        leased = [part.leases("eu", lane) for part in keys.every_partition() for lane in (0, 1)]
        assert sum(r.zcard(lease) for lease in leased) <= slots
        time.sleep(0.05)
    wait_for(
        lambda: all(read_job(r, keys, f"w{i}@eu").runs == 1 for i in range(12)),
        timeout=20,
        what="every job completed by the worker",
    )
    run_worker.stop()
    for i in range(12):
        job = read_job(r, keys, f"w{i}@eu")
        assert job.lease_token is None
        assert r.zscore(keys.of_job(job.job_id).due(), job.job_id) == pytest.approx(
            job.scheduled_at
        )
        last = json.loads(r.hget(keys.last_result(f"w{i}"), "eu"))
        assert (last["status"], last["region"]) == ("up", "eu")
    assert broker.llen(QUEUES[0]) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["redis-pipeline", "kombu-batch"])
def test_both_batch_publishers_are_consumed_by_a_real_worker(settings, broker, path, run_worker):
    app, seen = build_app(settings)
    publisher = (
        RedisBatchPublisher(settings.effective_broker_url)
        if path == "redis-pipeline"
        else KombuBatchPublisher(app)
    )
    messages = [
        TaskMessage(
            name="cbtest.echo",
            queue=QUEUES[i % 2],
            args=(f"m{i}",),
            time_limit=10,
            soft_time_limit=8,
        )
        for i in range(50)
    ]
    ids = publisher.publish(messages)
    assert len(set(ids)) == 50
    run_worker(app, QUEUES, 2)
    wait_for(lambda: len(seen) == 50, timeout=30, what="50 echo tasks")
    run_worker.stop()
    assert sorted(seen) == sorted(f"m{i}" for i in range(50))
