"""``checks reconcile`` moves the check half in place when ``CHECKBEAT_CHECK_PARTITIONS``
changed (``celery_app/checks/repartition.py``): every check keeps its definition, run state,
state, transitions and results, token buckets, maintenance windows and notification targets
(with the outcomes of each transition's sends) come along, nothing is
left under the old names, and it refuses while a worker is registered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.health import run_once
from support.projects import run_module

from celery_app.checks.check_state import read_tenant_transitions
from celery_app.checks.jobs import from_unix, read_job
from celery_app.checks.layout import ensure_layout, stored_partitions
from celery_app.checks.maintenance import MaintenanceStore, validate_window
from celery_app.checks.notify import (
    NotifyStore,
    Outcome,
    read_outcomes,
    record_outcome,
    validate_target,
)
from celery_app.checks.ratelimit import get_rate_limit, set_rate_limit
from celery_app.checks.repair import repair
from celery_app.checks.repartition import WorkersStillRunning, repartition
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import pending
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import BucketField, CheckStateField
from celery_app.settings import load_settings
from scheduling_core import Params

ROOT = Path(__file__).resolve().parents[1]
REGIONS = ["eu", "us"]


def _settings(redis_url: str, broker_url: str, partitions: int):
    return load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=REGIONS,
        check_partitions=partitions,
    )  # fmt: skip


@pytest.mark.timeout(90)
def test_reconcile_moves_every_check_with_its_state_and_back(r, redis_url, broker_url, test_kind):
    one = _settings(redis_url, broker_url, 1)
    keys1 = state_keys(one)
    store = CheckStore(r, keys1, one)
    ensure_layout(r, keys1)
    uids = [f"c{i}" for i in range(8)]
    for i, uid in enumerate(uids):
        store.create(uid=uid, tenant=f"t{i % 2}", kind=test_kind, target=uid, period=60,
                     regions=REGIONS, failure_threshold=1, success_threshold=1,
                     quorum=1)  # fmt: skip
    set_rate_limit(r, keys1, "t1", per_minute=120, burst=10)
    now = r.time()[0] + 0.0
    # the window opens twelve hours away, so it moves along but never holds c2's transition back
    away = (from_unix(now).hour + 12) % 24
    window = validate_window(tenant="t0", cron=f"0 {away} * * *", duration=3600, timezone="UTC")
    MaintenanceStore(r, keys1).add(window)
    target = validate_target(tenant="t0", url="json://hooks.example.com/in", target_id="n1")
    NotifyStore(r, keys1).add(target)
    written, transition = run_once(r, keys1, one, Params.from_settings(one), "c2@eu", False, now)
    assert written and transition == "c2#1"
    assert run_once(r, keys1, one, Params.from_settings(one), "c3@us", True, now)[0]
    before = {uid: read_job(r, keys1, f"{uid}@eu") for uid in uids}
    undelivered = pending(r, keys1)
    assert undelivered == 1
    sent = Outcome(target=target.shown, scope=target.scope, ok=True, at=now, attempts=1)
    record_outcome(r, keys1, transition, "n1", sent)

    four = _settings(redis_url, broker_url, 4)
    keys4 = state_keys(four)
    # a registered worker would write the old names while they move: refused, nothing moved
    r.hset(keys1.worker("w@h"), "concurrency", 4)
    r.sadd(keys1.region_workers("eu"), "w@h")
    with pytest.raises(WorkersStillRunning, match="w@h"):
        repartition(r, keys4, REGIONS)
    assert stored_partitions(r, keys4) == 1 and r.exists(keys1.check("c0"))
    r.delete(keys1.worker("w@h"), keys1.region_workers("eu"))

    moved = run_module(
        "celery_app.cli", "-A", "celery_app", "checks", "reconcile", "--json", cwd=ROOT,
        pythonpath=[ROOT], CHECKBEAT_CHECK_PARTITIONS="4", CHECKBEAT_REGIONS="eu,us",
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    report = json.loads(moved.stdout)
    assert report["repartitioned"] == {"before": 1, "after": 4, "checks": 8}
    assert report["checks"] == 8 and report["conflicts"] == []

    assert stored_partitions(r, keys4) == 4
    store4 = CheckStore(r, keys4, four)
    assert store4.uids() == uids
    assert len({keys4.of_check(uid).partition for uid in uids}) > 1
    for uid in uids:
        part = keys4.of_check(uid)
        assert r.sismember(part.checks(), uid)
        for region in REGIONS:  # every job placed again, due in its own partition
            assert r.zscore(part.due(), f"{uid}@{region}") is not None
        after = read_job(r, keys4, f"{uid}@eu")
        assert (after.runs, after.cost_ewma_ms, after.lane) == (
            before[uid].runs, before[uid].cost_ewma_ms, before[uid].lane,
        )  # fmt: skip
    assert r.hget(keys4.check_state("c2"), CheckStateField.STATE) == "down"
    assert r.xlen(keys4.check_transitions("c2")) == 1
    assert [t["id"] for t in read_tenant_transitions(r, keys4, "t0")] == ["c2#1"]
    assert pending(r, keys4) == undelivered
    assert r.zscore(keys4.of_transition("c2#1").transition_outbox(), "c2#1") is not None
    assert r.xlen(keys4.results("c3")) == 1
    bucket = get_rate_limit(r, keys4, "t1")
    assert (bucket.per_minute, bucket.burst) == (120, 10)
    shares = {float(r.hget(p.rate_limit("t1"), BucketField.RATE)) for p in keys4.every_partition()}
    assert shares == {30.0}
    assert [w.id for w in MaintenanceStore(r, keys4).list()] == [window.id]
    assert NotifyStore(r, keys4).list() == [target]
    assert read_outcomes(r, keys4, "c2#1") == {"n1": sent}
    # nothing is left under the old names (the cron half and the layout record aside)
    kept = ("cbtest:{checks.", "cbtest:layout")
    assert [k for k in r.scan_iter("cbtest:*") if not k.startswith(kept)] == []

    # and back: today's names again, byte for byte
    assert repartition(r, keys1, REGIONS).checks == 8
    repair(r, keys1, Params.from_settings(one), from_unix(now))  # what reconcile runs next
    assert r.exists("cbtest:check:c2", "cbtest:job:c2@eu", "cbtest:state:c2") == 3
    assert [k for k in r.scan_iter("cbtest:{checks.*")] == []
    assert CheckStore(r, keys1, one).uids() == uids
    assert NotifyStore(r, keys1).list() == [target]
    assert read_outcomes(r, keys1, "c2#1") == {"n1": sent}
