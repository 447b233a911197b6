"""Runs that never report: a hard time limit kill (prefork) and a killed worker (SIGKILL).

Neither may leave the job claimed: the hard limit is recorded by the main process's
``task_failure`` handler (once, although Celery 5.7 sends that signal twice), a dead worker's
run by the dispatcher's lease reaper.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.checks import RECORD_KEYS
from support.partitions import pinned, served_partition, suite_keys
from support.polling import wait_for

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.checks.store import CheckStore
from celery_app.redis.schema import job_id

KEYS = suite_keys("cbtest")
REPO = Path(__file__).resolve().parent.parent
LIMITS = {"check_timeout": 1.0, "lease_margin": 0.5}
WORKER_ENV = {
    "CHECKBEAT_CHECK_TIMEOUT": "1",
    "CHECKBEAT_LEASE_MARGIN": "0.5",
    "CHECKBEAT_IMPORTS": "custom_kinds",
    "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}
QUEUES = "checks.local.fast,checks.local.slow"


def history(r, uid: str) -> list[dict]:
    return [json.loads(f["result"]) for _id, f in r.xrange(KEYS.results(uid))]


def claim_once(app, r, job: str, timeout: float = 20.0) -> None:
    """Tick the real dispatcher until it has claimed ``job`` (then stop ticking)."""
    dispatcher = Dispatcher(app, client=r, partition=KEYS.of_job(job).partition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = dispatcher.tick()
        if any(c.job_id == job for c in report.claims):
            return
        time.sleep(0.05)
    raise AssertionError(f"{job} was never claimed")


@pytest.mark.timeout(60)
def test_a_hard_time_limit_is_recorded_once_as_a_timeout(r, make_app, start_worker_process):
    import custom_kinds  # noqa: F401 - the store validates the user kind in this process

    app = make_app(**LIMITS)
    worker = start_worker_process(
        "-P", "prefork", "-c", "1", "-Q", QUEUES, "-n", "pf@kill", **WORKER_ENV
    )
    wait_for(lambda: r.exists(KEYS.worker("pf@kill")), 30, what="the prefork worker")
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    uid = pinned(KEYS, "stubborn", served_partition(r, KEYS, "pf@kill"))  # its one slot's
    store.create(
        uid=uid,
        tenant="t",
        kind="sleepy",
        target="anything",
        config={"seconds": 30, "stubborn": True},
        period=1,
    )
    job = job_id(uid, "local")
    claim_once(app, r, job)

    # soft limit 1 s (swallowed by the probe), hard limit 1 + 2 s (+ the lead): the pool kills it
    wait_for(lambda: read_job(r, KEYS, job).lease_token is None, 20, what="the kill recorded")
    state = read_job(r, KEYS, job)
    assert state.runs == 1  # task_failure came twice; the second write found no lease
    assert state.cost_ewma_ms == pytest.approx(1000.0)  # pinned to the ceiling
    home = KEYS.of_job(job)
    assert r.zscore(home.due(), job) == pytest.approx(state.scheduled_at)
    assert r.zcard(home.leases("local", 0)) + r.zcard(home.leases("local", 1)) == 0
    (result,) = history(r, uid)
    assert (result["status"], result["error_class"]) == ("timeout", "timeout")
    # Celery's hard limit also holds the dispatch lead (a run claimed ahead waits for its tick)
    lead = app.conf.checkbeat_settings.dispatch_lead
    assert f"hard time limit ({3 + lead:g} s)" in result["error"]
    assert set(result) == RECORD_KEYS and result["lane"] == "fast"  # one shape on every path
    # the pool's error path and Request.on_timeout race: either may log and signal first
    logged = f"Hard time limit ({3 + lead}s) exceeded"
    wait_for(lambda: logged in worker.output(), 10, what="the log")
    # Celery 5.7 sent task_failure twice: the second write found the lease gone
    wait_for(lambda: f"{job} not recorded" in worker.output(), 10, what="second signal")
    assert worker.process.poll() is None  # the worker lives on


@pytest.mark.timeout(60)
def test_a_killed_worker_is_reaped_through_the_lease(
    r, make_app, start_worker_process, target, allow_private
):
    app = make_app(allow_private_targets=True, **LIMITS)
    worker = start_worker_process(
        "-P", "threads", "-c", "2", "-Q", QUEUES, "-n", "doomed@kill", **WORKER_ENV
    )
    wait_for(lambda: r.exists(KEYS.worker("doomed@kill")), 30, what="the worker")
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    uid = pinned(KEYS, "hang", served_partition(r, KEYS, "doomed@kill"))  # a slot of its
    store.create(uid=uid, tenant="t", kind="http", target=target.url("/delay/30000"), period=1)
    job = job_id(uid, "local")
    claim_once(app, r, job)
    wait_for(lambda: target.hits("/delay/30000") == 1, 20, what="the probe to start")
    worker.kill()  # SIGKILL: no post-exec, no warm shutdown

    dispatcher = Dispatcher(app, client=r, partition=KEYS.of_job(job).partition)
    assert dispatcher.reap(time.time()) == 0  # the lease (1 + 2 + 0.5 s) still runs
    wait_for(lambda: dispatcher.reap(time.time()) == 1, 10, what="the lease to be reaped")
    state = read_job(r, KEYS, job)
    assert state.lease_token is None and state.runs == 1
    assert state.cost_ewma_ms == pytest.approx(1000.0)
    assert r.zscore(KEYS.of_job(job).due(), job) == pytest.approx(state.scheduled_at)
    lost = history(r, uid)[-1]
    assert lost["status"] == "lost" and set(lost) == RECORD_KEYS
