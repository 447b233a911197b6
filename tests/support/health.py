"""Helpers of the check-state tests: one run of a job through the real post-exec write (lease,
then ``support.completion.finish``), and a workload that drives every transition script.
"""

from __future__ import annotations

import itertools

from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.redis.schema import DeliveryOutcome, TransitionStart, split_job_id
from support.checks import at
from support.completion import finish

_tokens = itertools.count(1)


def run_once(
    client,
    keys,
    settings,
    params,
    job_id: str,
    ok: bool,
    now_s: float,
    *,
    degraded: str | None = None,
) -> tuple[bool, str | None]:
    """Lease ``job_id`` and finish one run of it at ``now_s`` (ok or failed), as the worker
    does (HealthPlanner: the maintenance version read with the job, windows cached): (written,
    the transition id it made or None)."""
    from support.workers import claim_by_hand

    token = f"t{next(_tokens)}"
    claim_by_hand(client, keys, job_id, token)
    region = split_job_id(job_id)[1]
    detail = {"degraded": degraded} if degraded else {}
    record = RunRecord(
        status=RunStatus.UP if ok else RunStatus.DOWN,
        region=region,
        finished_at=now_s,
        error_class=None if ok else "http",
        detail=detail,
    )
    return finish(
        client,
        keys,
        settings,
        job_id,
        token,
        params=params,
        duration_ms=5.0,
        exec_start=at(now_s),
        now=at(now_s),
        record=record,
    )


def drive_transition_scripts(client, keys, store, app, t0: float) -> None:
    """Every transition script once: complete.lua's health part (a transition and a held one),
    transition_claim, _start, _finish (retry, failed, delivered) and _release."""
    from celery_app.checks.maintenance import MaintenanceStore, validate_window
    from celery_app.checks.transitions import (
        claim,
        finish_delivery,
        release_held,
        start_delivery,
    )
    from support.partitions import pinned

    settings = store.settings
    uid = pinned(keys, "tr", keys.partition)  # in ``keys``' partition: its outbox, holds, ...
    store.create(
        now=at(t0 - 100),
        uid=uid,
        tenant="acme",
        kind="testprobe",
        target="x",
        period=60,
        regions=["eu", "us"],
        failure_threshold=1,
        success_threshold=1,
        quorum=1,
    )
    _written, made = run_once(client, keys, settings, store.params, f"{uid}@eu", False, t0)
    assert made == f"{uid}#1", made
    assert claim(client, keys, settings, t0, [made]) == [made]
    verdict, _payload = start_delivery(client, keys, settings, made, "owner", t0)
    assert verdict == TransitionStart.RUN
    finish_delivery(client, keys, made, "owner", DeliveryOutcome.RETRY, t0, retry_in=1.0)
    start_delivery(client, keys, settings, made, "owner", t0 + 2)
    finish_delivery(client, keys, made, "owner", DeliveryOutcome.FAILED, t0 + 2, error={"e": 1})
    # a maintenance window holds the recovery; its end releases it
    window = validate_window(uid=uid, cron="* * * * *", duration=120, timezone="UTC")
    MaintenanceStore(client, keys).add(window)
    run_once(client, keys, settings, store.params, f"{uid}@eu", True, t0 + 10)
    assert client.zscore(keys.maintenance_held(), uid) is not None
    MaintenanceStore(client, keys).remove(window.id)
    released = release_held(client, keys, settings, t0 + 400)
    assert released == [f"{uid}#2"], released
    start_delivery(client, keys, settings, f"{uid}#2", "o2", t0 + 400)
    finish_delivery(client, keys, f"{uid}#2", "o2", DeliveryOutcome.DELIVERED, t0 + 400)
