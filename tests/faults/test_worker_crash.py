"""A worker killed mid-probe: a SIGKILLed prefork pool child, and a SIGKILLed whole worker.

Promises: the lease is resolved (recorded by the worker's main process, or reaped by the
dispatcher) no later than lease expiry + one dispatcher tick, the job is rescheduled and runs
again, a lost result is recorded, and no job ever runs twice at once. Check queues are consumed
without acks (the lease is the delivery guarantee): the killed worker's message is gone from the
broker, and a copy delivered again anyway (a duplicated publish) is dropped as stale.
The probe is ``crash_kinds.tracked``, which logs every start and end to Redis.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from crash_kinds import probe_events
from fault_procs import Processes, children, process_env
from support.checks import results
from support.partitions import pinned, served_partition, suite_keys
from support.polling import wait_for

from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import RUN_CHECK_TASK, run_kwargs
from celery_app.checks.store import CheckStore
from celery_app.redis.schema import check_queue, job_id

pytestmark = [pytest.mark.faults, pytest.mark.timeout(90)]

KEYS = suite_keys("cbtest")
HERE = Path(__file__).resolve().parent
QUEUES = "checks.local.fast,checks.local.slow"
TICK = 0.5  # CHECKBEAT_DISPATCH_INTERVAL (the default)
LIMITS = {"check_timeout": 2.0, "lease_margin": 0.5, "dispatch_interval": TICK}
ENV = {
    "CHECKBEAT_CHECK_TIMEOUT": "2",
    "CHECKBEAT_LEASE_MARGIN": "0.5",
    "CHECKBEAT_IMPORTS": "crash_kinds",
}
SLACK = 0.5  # scheduling noise on a loaded 2-core machine


def starts(r: redis.Redis) -> list[dict]:
    return [e for e in probe_events(r) if e["ev"] == "start"]


def overlap(r: redis.Redis, killed: dict[int, float]) -> int:
    from crash_kinds import max_overlap

    return max_overlap(probe_events(r), killed)


def _setup(tmp_path, make_app, r, worker_args, name):
    import crash_kinds  # noqa: F401 - the store validates the kind in this process

    app = make_app(**LIMITS)
    procs = Processes(tmp_path, process_env((HERE,), **ENV))
    worker = procs.worker(*worker_args, "-Q", QUEUES, "-n", name)
    wait_for(lambda: r.exists(KEYS.worker(name)), 30, what="the worker to register")
    # the victim lives in a partition of the check half the worker has a slot in
    uid = pinned(KEYS, "victim", served_partition(r, KEYS, name))
    CheckStore(r, KEYS, app.conf.checkbeat_settings).create(
        uid=uid, tenant="t", kind="tracked", target="victim", config={"seconds": 30}, period=2
    )
    return app, procs, worker, uid


def test_a_sigkilled_prefork_child_is_recorded_and_the_job_runs_again(
    tmp_path, make_app, r, dispatching, fault_report
):
    app, procs, worker, uid = _setup(
        tmp_path, make_app, r, ["-P", "prefork", "-c", "1"], "pf@crash"
    )
    job = job_id(uid, "local")
    try:
        dispatching(app, interval=TICK)
        wait_for(lambda: starts(r), 30, what="the probe to start")
        (first,) = starts(r)
        assert first["pid"] in children(worker.pid)  # the pool child is running the probe
        lease_expiry = read_job(r, KEYS, job).lease_expiry
        killed_at = time.time()
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: read_job(r, KEYS, job).lease_token is None, 15, what="the lease resolved")
        resolved_at = time.time()
        state = read_job(r, KEYS, job)
        assert resolved_at <= lease_expiry + TICK + SLACK
        assert state.runs == 1
        assert state.cost_ewma_ms == pytest.approx(2000.0)  # pinned to the ceiling
        (lost,) = results(r, KEYS, uid)
        assert lost["status"] in ("timeout", "lost")
        # the pool's parent reports the lost child (WorkerLostError) or, if the hard time limit
        # fires first on a loaded machine, the kill: either way a run that never reported
        why = lost.get("error") or lost.get("reason") or ""
        assert "lost" in why or "killed" in why, why
        assert r.zscore(KEYS.of_job(job).due(), job) == pytest.approx(state.scheduled_at)
        # the job runs again, in the pool's replacement child, while the worker lives on
        wait_for(lambda: len(starts(r)) >= 2, 30, what="the job to run again")
        rerun = starts(r)[1]
        assert rerun["pid"] != first["pid"] and worker.alive()
        assert overlap(r, {first["pid"]: killed_at}) == 1
        fault_report.add(
            "worker: SIGKILL a prefork child mid-probe",
            runs=len(starts(r)),
            duplicates=overlap(r, {first["pid"]: killed_at}) - 1,
            misses=0,
            max_recovery_s=resolved_at - killed_at,
            lease_expiry_after_kill_s=round(lease_expiry - killed_at, 3),
            rerun_after_kill_s=round(rerun["t"] - killed_at, 3),
        )
    finally:
        procs.stop_all()


def test_a_sigkilled_worker_is_reaped_and_a_copy_of_its_message_never_runs_twice(
    tmp_path, make_app, r, broker_url, dispatching, fault_report
):
    app, procs, worker, uid = _setup(
        tmp_path, make_app, r, ["-P", "threads", "-c", "2"], "th@crash"
    )
    job = job_id(uid, "local")
    broker = redis.Redis.from_url(broker_url)
    try:
        dispatching(app, interval=TICK)
        wait_for(lambda: starts(r), 30, what="the probe to start")
        (first,) = starts(r)
        leased = read_job(r, KEYS, job)
        lease_expiry = leased.lease_expiry
        killed_at = time.time()
        worker.kill(group=True)  # SIGKILL: no post-exec, no warm shutdown
        wait_for(lambda: read_job(r, KEYS, job).lease_token is None, 15, what="the lease reaped")
        reaped_at = time.time()
        assert reaped_at <= lease_expiry + TICK + SLACK
        (lost,) = results(r, KEYS, uid)
        assert lost["status"] == "lost"
        state = read_job(r, KEYS, job)
        assert state.runs == 1 and r.zscore(KEYS.of_job(job).due(), job) == pytest.approx(
            state.scheduled_at
        )

        # Consumed without acks: nothing of the killed worker's message is left to come back
        # after kombu's visibility timeout. A copy delivered anyway (a duplicated publish)
        # carries a reaped lease.
        assert broker.hlen("unacked") == 0 and broker.zcard("unacked_index") == 0
        copy = run_kwargs(job, leased.lease_token, leased.scheduled_at,
                          leased.effective_scheduled_at, 2.0)  # fmt: skip
        app.send_task(RUN_CHECK_TASK, kwargs=copy, queue=check_queue("local", leased.lane))
        slots = str(max(2, KEYS.partitions))  # a slot in every partition, the victim's too
        second = procs.worker("-P", "threads", "-c", slots, "-Q", QUEUES, "-n", "th2@crash")
        wait_for(
            lambda: f"dropped run of {uid}@local: its lease was reaped" in second.output(),
            30,
            what="the stale redelivery to be dropped",
        )
        wait_for(lambda: len(starts(r)) >= 2, 30, what="the job to run again on a new worker")
        peak = overlap(r, {first["pid"]: killed_at})
        assert peak == 1
        fault_report.add(
            "worker: SIGKILL the whole worker mid-probe",
            runs=len(starts(r)),
            duplicates=peak - 1,
            misses=0,
            max_recovery_s=reaped_at - killed_at,
            reaped_after_lease_expiry_s=round(reaped_at - lease_expiry, 3),
            stale_copy_dropped=True,
        )
    finally:
        procs.stop_all()
