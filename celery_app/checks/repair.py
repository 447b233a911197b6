"""Rebuild the jobs from the check definitions after Redis lost or tore part of its state.

Why: with AOF on, a Redis restart keeps everything (tested in tests/faults). Without it, Redis
comes back from its last RDB snapshot, or empty. Definitions are the source of truth; jobs are
derived state, so whatever of a job a restore lost can be rebuilt:

- a check whose job hash is gone, or whose job sits in no index (not due, ready, held by the
  rate limit for any tenant, or leased), is
  placed at its next aligned tick again (keeping whatever EWMAs survived);
- a job that holds a lease the lease index forgot is put back in that index, so the reaper
  finishes it as a lost run instead of it staying claimed forever;
- the ``checks`` and per-tenant sets are re-added (the same store.lua write as an update);
- every token bucket's tenant is put back in the rate-limited index the claim reads.

No new claim can reissue a lease token a worker from before the restore still holds: tokens
carry 64 random bits per claim (``claiming.lease_token_prefix``), not a counter the restore
rolled back.

Quarantined jobs (``checks.quarantine``) of checks whose definition reads are released here:
rebuilt from the definition as new jobs; a job hash that cannot be read is rebuilt the same way.

Checks created after the snapshot are gone with it: re-apply them from wherever they are
managed (``checks add``). Run ``celery -A celery_app checks reconcile`` after a restore; it is
idempotent and safe while beat and workers run (each check's write is version-guarded).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import redis

from celery_app.checks.changes import CheckChange, JobChange, StoreStatus, encode_changes
from celery_app.checks.definition import StoredCheck, decode_check, encode_check
from celery_app.checks.jobs import JobState, format_ts, to_unix
from celery_app.checks.quarantine import DATA_ERRORS, quarantine, read_quarantine
from celery_app.checks.quarantine import release as release_quarantined
from celery_app.checks.ratelimit import index_rate_limits
from celery_app.checks.store import job_fields
from celery_app.redis.clock import server_time
from celery_app.redis.schema import JobField, Keys, QuarantineStep
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW, Params

BATCH = 500


@dataclass(frozen=True)
class RepairReport:
    checks: int
    placed: tuple[str, ...]
    leases_restored: tuple[str, ...]
    conflicts: tuple[str, ...]
    rate_limits_indexed: tuple[str, ...] = ()
    released: tuple[str, ...] = ()  # quarantined jobs rebuilt from their definitions
    undecodable: tuple[str, ...] = ()  # checks whose definition hash cannot be read


def check_uids(client: redis.Redis, keys: Keys) -> Iterator[str]:
    """Every uid with a definition hash in ``keys``' partition (the ``checks`` set itself may be
    what was lost)."""
    pattern = keys.check_definitions()
    head = pattern.removesuffix("*")
    for key in client.scan_iter(match=pattern, count=1000, _type="hash"):
        uid = key[len(head) :]
        if uid and ":" not in uid:
            yield uid


def plan_repair(
    stored: StoredCheck,
    jobs: dict[str, JobState | None],
    indexed: dict[str, bool],
    now: datetime,
    params: Params,
) -> tuple[CheckChange | None, list[str], list[JobState]]:
    """(store.lua change or None, jobs to place, leased jobs missing from the lease index)."""
    defn = stored.definition
    if not defn.enabled:
        return None, [], []
    entries: list[JobChange] = []
    placed: list[str] = []
    orphaned_leases: list[JobState] = []
    for region, jid in zip(defn.regions, defn.job_ids(), strict=True):
        job = jobs.get(jid)
        if job is not None and job.lease_token is not None:
            if not indexed[jid]:
                orphaned_leases.append(job)
            continue
        if job is not None and indexed[jid]:
            continue
        sa = defn.next_tick(region, now)
        cost = job.cost_ewma_ms if job else 0.0
        ea = params.effective_scheduled_at(sa, cost, defn.plan_weight)
        tenant = job.tenant if job is not None and job.tenant else defn.tenant
        entries.append(
            JobChange(
                jid,
                tenant,
                job_fields(defn),
                place=True,
                off=False,
                scheduled_at=format_ts(to_unix(sa)),
                effective_at=format_ts(to_unix(ea)),
            )
        )
        placed.append(jid)
    change = CheckChange(
        defn.uid,
        "put",
        stored.version,
        old_tenant=defn.tenant,
        tenant=defn.tenant,
        fields=encode_check(defn),
        jobs=tuple(entries),
    )
    return change, placed, orphaned_leases


def _read_indexed(
    client: redis.Redis, keys: Keys, job_ids: list[tuple[str, str]]
) -> tuple[dict[str, JobState | None], dict[str, bool]]:
    """Each job's state, and whether it is in some index: due, a late heartbeat, ready, leased,
    or held by any tenant (the region's held tenants, its definition's and its hash's): a job
    held by a tenant
    it no longer has is indexed, not lost (placing it again would run it twice)."""
    regions = sorted({jid.rpartition("@")[2] for jid, _ in job_ids})
    pipe = client.pipeline(transaction=False)
    for jid, _tenant in job_ids:
        region = jid.rpartition("@")[2]
        pipe.hgetall(keys.job(jid))
        pipe.zscore(keys.due(), jid)
        pipe.zscore(keys.heartbeats_late(), jid)
        for lane in (LANE_FAST, LANE_SLOW):
            pipe.zscore(keys.ready(region, lane), jid)
            pipe.zscore(keys.leases(region, lane), jid)
    for region in regions:
        pipe.smembers(keys.held_tenants(region))
    replies = pipe.execute()
    width = 7  # the hash, due, late heartbeats, ready and leases of both lanes
    jobs: dict[str, JobState | None] = {}
    indexed: dict[str, bool] = {}
    tenants: dict[str, set[str]] = {}
    members: dict[str, list[str]] = {}
    corrupt: list[str] = []
    for i, (jid, tenant) in enumerate(job_ids):
        h, *scores = replies[width * i : width * i + width]
        try:
            jobs[jid] = JobState.from_hash(jid, h) if h else None
        except DATA_ERRORS:
            jobs[jid] = None
            corrupt.append(jid)
        indexed[jid] = any(score is not None for score in scores)
        region = jid.rpartition("@")[2]
        if not indexed[jid]:
            members.setdefault(region, []).append(jid)
            tenants.setdefault(region, set()).update(
                t for t in (tenant, h.get(JobField.TENANT)) if t
            )
    held_by = dict(zip(regions, replies[width * len(job_ids) :], strict=True))
    lookups = [
        (region, keys.held(region, lane, tenant))
        for region in sorted(members)
        for tenant in sorted(tenants[region] | held_by[region])
        for lane in (LANE_FAST, LANE_SLOW)
    ]
    if lookups:
        pipe = client.pipeline(transaction=False)
        for region, key in lookups:
            pipe.zmscore(key, members[region])
        for (region, _key), scores in zip(lookups, pipe.execute(), strict=True):
            for jid, score in zip(members[region], scores, strict=True):
                if score is not None:
                    indexed[jid] = True
    if corrupt:
        # A hash that cannot even be read: set aside (out of every index) and rebuilt below.
        now_s = server_time(client)
        for jid in corrupt:
            why = "its job hash cannot be read; rebuilt from the definition"
            quarantine(client, keys, jid, QuarantineStep.RECONCILE, why, now_s)
            indexed[jid] = False
        release_quarantined(client, keys, corrupt)
    return jobs, indexed


def repair(client: redis.Redis, keys: Keys, params: Params, now: datetime) -> RepairReport:
    """Scan every definition and rebuild what its jobs lost (see the module docstring), in
    every partition of the check half."""
    indexed_limits = index_rate_limits(client, keys)
    reports = [_repair_partition(client, part, params, now) for part in keys.every_partition()]
    return RepairReport(
        checks=sum(r.checks for r in reports),
        placed=tuple(x for r in reports for x in r.placed),
        leases_restored=tuple(x for r in reports for x in r.leases_restored),
        conflicts=tuple(x for r in reports for x in r.conflicts),
        rate_limits_indexed=tuple(indexed_limits),
        released=tuple(x for r in reports for x in r.released),
        undecodable=tuple(x for r in reports for x in r.undecodable),
    )


def _repair_partition(
    client: redis.Redis, keys: Keys, params: Params, now: datetime
) -> RepairReport:
    """:func:`repair` of one partition (``keys``'): every definition stored there."""
    uids = list(check_uids(client, keys))
    placed: list[str] = []
    restored: list[str] = []
    conflicts: list[str] = []
    released: list[str] = []
    undecodable: list[str] = []
    for start in range(0, len(uids), BATCH):
        chunk = uids[start : start + BATCH]
        pipe = client.pipeline(transaction=False)
        for uid in chunk:
            pipe.hgetall(keys.check(uid))
        stored = []
        for uid, h in zip(chunk, pipe.execute(), strict=True):
            try:
                if h:
                    stored.append(decode_check(uid, h))
            except DATA_ERRORS:  # a torn definition: its jobs stay as they are (quarantined)
                undecodable.append(uid)
        released.extend(
            release_quarantined(client, keys, [j for s in stored for j in s.definition.job_ids()])
        )
        job_ids = [(jid, s.definition.tenant) for s in stored for jid in s.definition.job_ids()]
        jobs, indexed = _read_indexed(client, keys, job_ids)
        writes = client.pipeline(transaction=False)
        planned: list[tuple[str, list[str]]] = []
        for s in stored:
            ids = s.definition.job_ids()
            change, to_place, leases = plan_repair(
                s, {j: jobs[j] for j in ids}, {j: indexed[j] for j in ids}, now, params
            )
            for job in leases:
                expiry = job.lease_expiry if job.lease_expiry is not None else to_unix(now)
                writes.zadd(keys.leases(job.region, job.lane), {job.job_id: expiry})
                restored.append(job.job_id)
            if change is not None:
                store_keys, payload = encode_changes(keys, [change])
                run_script(writes, "store", keys=store_keys, args=[payload])
                planned.append((s.definition.uid, to_place))
        statuses = [st for st in writes.execute() if isinstance(st, list)]
        for (uid, to_place), status in zip(planned, statuses, strict=True):
            if status[0] == StoreStatus.OK:
                placed.extend(to_place)
            else:
                conflicts.append(uid)
    known = set(uids)
    quarantined = [q.job_id for q in read_quarantine(client, keys) if keys.of_job(q.job_id) == keys]
    gone = [j for j in quarantined if j.rpartition("@")[0] not in known]
    release_quarantined(client, keys, gone)  # their checks were deleted: nothing to rebuild
    return RepairReport(
        len(uids),
        tuple(placed),
        tuple(restored),
        tuple(conflicts),
        released=tuple(released),
        undecodable=tuple(undecodable),
    )
