"""``checks reconcile``: rebuild the jobs from the check definitions (AOF off, restore).

Without AOF a Redis restart loses everything since the last snapshot, or everything. Check
definitions are the source of truth and small: back them up (``DUMP``/``RESTORE`` of the
``check:<uid>`` hashes, or re-apply with ``checks add``) and ``checks reconcile`` rebuilds every
job, index and set from them. These tests take the state apart the ways a restore can and
prove reconcile puts it back, through the real dispatcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from fault_procs import ROOT, process_env
from support.partitions import count_in, dispatchers, members_in, suite_keys

from celery_app.checks.jobs import read_job
from celery_app.checks.repair import repair
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.schema import job_id
from scheduling_core import Params

pytestmark = pytest.mark.faults

KEYS = suite_keys("cbtest")


def _create(store: CheckStore, n: int, regions=("local",)) -> list[str]:
    uids = [f"c{i}" for i in range(n)]
    for uid in uids:
        store.create(
            uid=uid, tenant=f"t{int(uid[1:]) % 3}", kind="tcp", target="example.com:443",
            period=30, regions=list(regions),
        )  # fmt: skip
    return uids


def test_reconcile_rebuilds_lost_jobs_indexes_sets_and_leases(make_app, r):
    app = make_app(regions=["local", "eu"])
    settings = app.conf.checkbeat_settings
    store = CheckStore(r, KEYS, settings)
    params = Params.from_settings(settings)
    uids = _create(store, 6, regions=("local", "eu"))
    r.hset(KEYS.job(job_id("c1", "local")), "c", "420.0")  # an EWMA that survived
    # What a partial restore leaves: lost job hashes, a job in no index, lost sets, and a
    # job holding a lease the lease index forgot.
    r.delete(KEYS.job(job_id("c0", "local")), KEYS.job(job_id("c0", "eu")))
    r.zrem(KEYS.of_check("c0").due(), job_id("c0", "local"), job_id("c0", "eu"))
    r.zrem(KEYS.of_check("c1").due(), job_id("c1", "local"))
    for part in KEYS.every_partition():
        r.delete(part.checks(), part.tenant_checks("t0"))
    r.zrem(KEYS.of_check("c2").due(), job_id("c2", "eu"))
    r.hset(KEYS.job(job_id("c2", "eu")), mapping={"lt": "99.1", "lx": f"{time.time() - 1:.3f}"})
    # a rate-limited job waits in its tenant's held index: that is a place, left alone
    held = job_id("c3", "local")
    r.zrem(KEYS.of_check("c3").due(), held)
    r.zadd(KEYS.of_check("c3").held("local", 0, "t0"), {held: time.time()})

    report = repair(r, KEYS, params, datetime.now(UTC))
    assert report.checks == 6 and not report.conflicts
    assert sorted(report.placed) == sorted(
        [job_id("c0", "local"), job_id("c0", "eu"), job_id("c1", "local")]
    )
    assert report.leases_restored == (job_id("c2", "eu"),)
    assert members_in(r, KEYS, lambda k: k.checks()) == set(uids)
    assert members_in(r, KEYS, lambda k: k.tenant_checks("t0")) == {"c0", "c3"}
    for uid in uids:
        for region in ("local", "eu"):
            jid, home = job_id(uid, region), KEYS.of_check(uid)
            indexed = (
                r.zscore(home.due(), jid) is not None
                or r.zscore(home.leases(region, 0), jid) is not None
                or r.zscore(home.held(region, 0, "t0"), jid) is not None
            )
            assert indexed, jid
    assert read_job(r, KEYS, job_id("c1", "local")).cost_ewma_ms == pytest.approx(420.0)
    assert r.zscore(KEYS.of_check("c3").due(), held) is None  # not placed twice
    # the restored lease is reaped as a lost run by the real dispatchers (one per partition)
    assert sum(d.reap(time.time()) for d in dispatchers(app, r)) == 1
    assert read_job(r, KEYS, job_id("c2", "eu")).lease_token is None
    # idempotent: a second pass changes nothing
    again = repair(r, KEYS, params, datetime.now(UTC))
    assert again.placed == () and again.leases_restored == ()


def test_aof_off_restart_loses_state_and_reconcile_rebuilds_from_backed_up_definitions(
    tmp_path, fault_report
):
    """AOF off: a restart loses every key (no snapshot either). Definitions backed up with DUMP
    are restored, and ``checks reconcile`` (the real CLI) rebuilds the jobs."""
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        env = process_env(CHECKBEAT_REDIS_URL=server.url(1), CHECKBEAT_BROKER_URL=server.url(0))
        from celery_app.settings import load_settings

        settings = load_settings(redis_url=server.url(1), broker_url=server.url(0))
        import redis

        client = redis.Redis.from_url(server.url(1), decode_responses=True)
        store = CheckStore(client, KEYS, settings)
        uids = _create(store, 20)
        raw = redis.Redis.from_url(server.url(1))
        backup = {KEYS.check(uid): raw.dump(KEYS.check(uid)) for uid in uids}

        server.kill()
        server.start()
        assert client.dbsize() == 0  # AOF off, no snapshot: everything is gone

        for key, blob in backup.items():
            raw.restore(key, 0, blob)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "celery_app.cli", "-A", "celery_app", "checks", "reconcile",
             "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rebuilt = time.monotonic() - started
        report = json.loads(done.stdout)
        assert report["checks"] == 20 and len(report["placed"]) == 20
        assert members_in(client, KEYS, lambda k: k.checks()) == set(uids)
        assert count_in(client, KEYS, lambda k: k.due()) == 20
        fault_report.add(
            "redis restart, AOF off: rebuild from definitions",
            runs=20,
            misses=20 - len(report["placed"]),
            max_recovery_s=rebuilt,
            lost="jobs, EWMAs, results, cron state, broker messages",
        )
    finally:
        server.stop()
