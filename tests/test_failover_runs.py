"""A Sentinel failover in the middle of check runs, with real processes: a ``celery beat`` (the
dispatcher) and a worker on the Sentinel state store (the broker on the suite's plain Redis,
or, ``broker-too``, on the same Sentinel deployment), checks of a 2 s period probing a real
HTTP server on 127.0.0.1, the master killed (SIGKILL) while probes are in flight and the
replica promoted.

What is measured, per check and per phase-aligned tick over the whole window (before, across
and after the failover): the requests the target received against the ticks due. No tick may
be probed twice; a tick not probed must be reported (a run record naming it: the reaper's lost
run; or the job's counters: abandoned, skipped by a rate limit, passed over by a late run).
docs/high-availability.md ("A check run across a failover") explains each case.
"""

from __future__ import annotations

import signal
import time

import pytest
import redis
from support.checks import results
from support.polling import wait_for
from support.processes import Processes
from support.tick_ledger import TickLedger

from celery_app.checks.store import CheckStore
from celery_app.factory import create_app
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import JobField, job_id
from celery_app.settings import load_settings

CHECKS = [f"fo{i}" for i in range(8)]
PERIOD_S = 2
PROBE_MS = 300  # so that some probe is in flight whenever the master dies
QUEUES = "checks.local.fast,checks.local.slow"
#: More than loopback's socket buffers hold: what follows it on the replication link stays in
#: the master's memory while the replica is stopped, and dies with the master.
LINK_FILLER_BYTES = 64 * 1024 * 1024


def _counters(client: redis.Redis, keys, uid: str) -> int:
    """The job's ticks reported as not run: abandoned, skipped by a rate limit, passed over."""
    counted = (JobField.ABANDONED, JobField.SKIPPED, JobField.PASSED)
    return sum(int(x or 0) for x in client.hmget(keys.job(job_id(uid, "local")), counted))


def _writes(client: redis.Redis) -> bool:
    try:
        client.set("cbtest:failover:probe", "1")
        return True
    except redis.RedisError:
        return False


def _leases(master: redis.Redis, keys) -> dict[str, str]:
    """The lease token of each leased check's job, read on the master itself."""
    tokens = {
        uid: master.hget(keys.job(job_id(uid, "local")), JobField.LEASE_TOKEN) for uid in CHECKS
    }
    return {uid: token for uid, token in tokens.items() if token}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("lagging", "sentinel_broker"),
    [(False, False), (True, False), (False, True)],
    ids=["replica-in-step", "replica-lagging", "broker-too"],
)
def test_a_failover_mid_runs_runs_no_tick_twice_and_reports_every_tick_not_run(
    sentinel_deployment,
    broker,
    broker_url,
    target,
    start_worker_process,
    tmp_path,
    lagging,
    sentinel_broker,
):
    """``replica-lagging``: the replica is stopped (SIGSTOP) and its link filled (a large value
    written to another database: the socket buffers hold only part of it, the rest waits in the
    master's memory) until the master has made a claim the replica cannot have, and its run
    has probed or 1 s has passed; then the master is killed and the replica resumed and
    promoted, and the writes in between (claims, starts, completions) are lost. A run of a
    lost claim must not have probed: its start WAIT (a 2 s timeout here, longer than the stop)
    is still waiting when the master dies. (Without the start WAIT such a run probes within
    the second, and its tick is claimed and probed again on the promoted replica.)"""
    state_url = sentinel_deployment.url(1)
    if sentinel_broker:  # the broker fails over with the state (its database 0)
        broker_url = sentinel_deployment.url(0)
    settings = load_settings(redis_url=state_url, broker_url=broker_url, allow_private_targets=True)
    keys = state_keys(settings)
    client = get_redis(state_url, settings)
    env = {
        "CHECKBEAT_REDIS_URL": state_url,
        "CHECKBEAT_BROKER_URL": broker_url,
        "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",
        "CHECKBEAT_CHECK_TIMEOUT": "2",
        "CHECKBEAT_LEASE_MARGIN": "1",
        "CHECKBEAT_DISPATCH_INTERVAL": "0.2",
    }
    if lagging:
        env["CHECKBEAT_REDIS_WAIT_TIMEOUT"] = "2"
    worker = start_worker_process("-P", "threads", "-c", "8", "-Q", QUEUES, "-n", "fo@w", **env)
    procs = Processes(tmp_path)
    try:
        procs.celery("beat", "beat", "-l", "INFO", "--pidfile=", "-s", str(tmp_path / "sch"), **env)
        wait_for(lambda: client.exists(keys.worker("fo@w")), 60, what="the worker's heartbeat")
        app = create_app(settings)
        app.loader.import_default_modules()  # the kinds, as the CLI and the workers load them
        store = CheckStore.for_app(app)
        for uid in CHECKS:
            target.set_delay(uid, PROBE_MS)
            store.create(
                uid=uid, tenant="t", kind="http", target=target.url(f"/named/{uid}"),
                period=PERIOD_S,
            )  # fmt: skip

        def hits_since(since: float, at_least: int) -> bool:
            return all(
                sum(h >= since for h in target.hit_times(f"/named/{uid}")) >= at_least
                for uid in CHECKS
            )

        wait_for(lambda: hits_since(0, 2), 60, what=f"steady runs\n{worker.output()}")
        window_start = time.time()
        before = {uid: _counters(client, keys, uid) for uid in CHECKS}
        wait_for(lambda: hits_since(window_start, 2), 30, what="runs inside the window")

        def probing() -> bool:  # a probe in flight: a hit within the last PROBE_MS / 2
            now = time.time()
            return any(
                now - max(target.hit_times(f"/named/{uid}")) < PROBE_MS / 2000 for uid in CHECKS
            )

        wait_for(probing, 10, interval=0.005, what="a probe in flight")
        replica = sentinel_deployment.replica.process
        if lagging:
            master = redis.Redis(port=sentinel_deployment.master.port, decode_responses=True, db=1)
            replica.send_signal(signal.SIGSTOP)
            with redis.Redis(port=sentinel_deployment.master.port, db=15) as other:
                other.set("filler", b"x" * LINK_FILLER_BYTES)
            stopped, replicated = time.monotonic(), set(_leases(master, keys).values())
            unreplicated: dict[str, float] = {}  # check -> when its lost claim was seen

            def lost_claim_probed_or_a_second() -> bool:
                for uid, token in _leases(master, keys).items():
                    if token not in replicated:
                        unreplicated.setdefault(uid, time.time())
                return bool(unreplicated) and (
                    time.monotonic() - stopped > 1.0
                    or any(
                        max(target.hit_times(f"/named/{uid}")) > seen
                        for uid, seen in unreplicated.items()
                    )
                )

            wait_for(lost_claim_probed_or_a_second, 5, interval=0.005, what="a lost claim")
        killed_at = time.time()
        sentinel_deployment.kill_master()
        if lagging:
            replica.send_signal(signal.SIGCONT)
        wait_for(
            lambda: sentinel_deployment.master_port_seen() == sentinel_deployment.replica.port,
            30,
            what="the Sentinels to promote the replica",
        )
        wait_for(lambda: _writes(client), 30, what="writes on the promoted replica")
        resumed_at = time.time()
        window_end = resumed_at + 4 * PERIOD_S
        # every job probed past the window's end: each of its ticks up to then ran or was
        # given up (a lost run is reaped, and recorded, before the job's next run)
        wait_for(
            lambda: hits_since(window_end + PERIOD_S, 1),
            60,
            what=f"runs after the failover\n{worker.output()}\n{procs.output('beat')}",
        )
        procs.stop()
        worker.stop()

        measured = []
        for uid in CHECKS:
            sa = float(client.hget(keys.job(job_id(uid, "local")), JobField.SCHEDULED_AT))
            ledger = TickLedger(PERIOD_S, int(sa) % PERIOD_S, window_start, window_end).count(
                target.hit_times(f"/named/{uid}"), results(client, keys, uid)
            )
            reported = _counters(client, keys, uid) - before[uid]
            measured.append((uid, ledger, reported))
        summary = "\n".join(
            f"{uid}: {ledger.describe()}, counters {reported}" for uid, ledger, reported in measured
        )
        summary += (
            f"\nmaster killed at {killed_at:.3f}; writes again {resumed_at - killed_at:.1f} s on"
        )
        print(summary)
        for uid, ledger, reported in measured:
            assert len(ledger.due()) >= 6, summary  # the window spans the failover
            assert ledger.twice() == [], f"{uid} probed a tick twice\n{summary}"
            assert len(ledger.unrecorded_misses()) <= reported, (
                f"{uid} lost ticks nothing reports\n{summary}"
            )
    finally:
        procs.stop()
