"""The check store: writing definitions and reconciling them into (check, region) jobs.

Every change is one Lua call (``lua/store.lua``, its keys declared by
:mod:`celery_app.checks.changes`) guarded by the check's version, so a refused or concurrent
change writes nothing. Reconcile rules: a new job, or one whose period, regions or
spread changed, is placed at ``next_aligned(...)`` with its region's phase; a surviving job keeps
its cost and delay EWMAs and lane; removed regions' jobs are deleted with their index entries
and leases (a run already started finishes and its completion is discarded: the lease is gone).

Definitions and their validation live in :mod:`celery_app.checks.definition`.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import redis

from celery_app.checks.changes import (
    MUST_NOT_EXIST,
    CheckChange,
    JobChange,
    JobRemoval,
    StoreStatus,
    encode_changes,
)
from celery_app.checks.definition import (
    CheckDefinition,
    StoredCheck,
    decode_check,
    encode_check,
    health_fields,
    probe_digest,
    validate_definition,
)
from celery_app.checks.heartbeat_kind import HEARTBEAT_KIND
from celery_app.checks.jobs import JobState, format_ts, from_unix, read_jobs, to_unix
from celery_app.checks.maintenance import MaintenanceStore
from celery_app.checks.notify import NotifyStore
from celery_app.checks.quarantine import release as release_quarantined
from celery_app.errors import CheckExists, CheckFieldError, CheckNotFound, ConcurrentUpdate
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CheckField, JobField, Keys, by_partition, maintenance_scope
from celery_app.redis.scripts import run_script
from celery_app.registry import SHARED, Registry, registry_of
from celery_app.settings import Settings
from scheduling_core import Params

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from celery import Celery

_RETRIES = 5


# --- reconcile (pure) -------------------------------------------------------------------------


def listed_uids(client: Any, keys: Keys, tenant: str | None = None) -> list[str]:
    """The uids of every check (of ``tenant``), sorted: the union of each partition's set."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        pipe.smembers(part.tenant_checks(tenant) if tenant else part.checks())
    return sorted(set().union(*pipe.execute()))  # decode_responses=True


def job_fields(defn: CheckDefinition) -> dict[str, str]:
    """The job hash fields copied from the definition (tenant, weight, period, regions, spread,
    thresholds and quorum, whether its check is a heartbeat, the digest of what it probes):
    written by every reconcile, and by the repair after a restore."""
    fields: dict[str, str] = {
        JobField.TENANT: defn.tenant,
        JobField.PLAN_WEIGHT: str(defn.plan_weight),
        JobField.PERIOD: str(defn.period),
        JobField.REGIONS: ",".join(defn.regions),
        JobField.HEARTBEAT: "1" if defn.kind == HEARTBEAT_KIND else "0",
    }
    check = encode_check(defn)
    fields[JobField.PROBE_DIGEST] = probe_digest(
        check[CheckField.KIND], check[CheckField.TARGET], check[CheckField.CONFIG]
    )
    if defn.region_spread is not None:
        fields[JobField.REGION_SPREAD] = repr(defn.region_spread)
    fields.update(health_fields(defn, JobField))
    return fields


def _phase_changed(old: CheckDefinition, new: CheckDefinition) -> bool:
    return (
        old.period != new.period
        or old.regions != new.regions
        or old.region_spread != new.region_spread
    )


def plan_change(
    old: StoredCheck | None,
    new: CheckDefinition | None,
    jobs: Mapping[str, JobState | None],
    now: datetime,
    params: Params,
) -> CheckChange:
    """The store.lua change that turns ``old`` into ``new`` (None = delete).

    ``jobs`` maps job ids to their stored state, as far as they were read: the old definition's
    jobs keep their EWMAs, and every job's stored tenant says which held indexes to leave (a job
    not read is taken to hold the definition's tenant; store.lua refuses the change as
    ``stale`` if it holds another).
    """
    old_def = old.definition if old else None
    subject = new or old_def
    if subject is None:
        raise ValueError("plan_change needs an old or a new definition")

    def stored_tenant(jid: str, default: str) -> str:
        state = jobs.get(jid)
        return state.tenant if state is not None and state.tenant else default

    old_ids = old_def.job_ids() if old_def else []
    expect = old.version if old else MUST_NOT_EXIST
    old_tenant = old_def.tenant if old_def else ""
    if new is None:
        assert old_def is not None
        removals = tuple(JobRemoval(j, stored_tenant(j, old_def.tenant)) for j in sorted(old_ids))
        return CheckChange(subject.uid, "delete", expect, old_tenant, remove=removals)
    new_ids = new.job_ids()
    replace_all = old_def is not None and _phase_changed(old_def, new)
    enabling = old_def is not None and new.enabled and not old_def.enabled
    reweighed = old_def is not None and old_def.plan_weight != new.plan_weight
    job_changes = []
    for region, jid in zip(new.regions, new_ids, strict=True):
        existing = jobs.get(jid) if jid in old_ids else None
        place = existing is None or replace_all or enabling
        sa = ea = None
        if place:
            # a new job may start at once; a re-placed one never in the second it just ran
            tick = new.first_tick(region, now) if existing is None else new.next_tick(region, now)
            cost = existing.cost_ewma_ms if existing else 0.0
            sa = format_ts(to_unix(tick))
            ea = format_ts(to_unix(params.effective_scheduled_at(tick, cost, new.plan_weight)))
        fields = job_fields(new)
        if not place and reweighed and existing is not None and existing.scheduled_at:
            # The deadline follows the new weight from the job's current tick and cost, so it
            # is promoted by the new weight now, not by the old one until its next run.
            reweighed_at = params.effective_scheduled_at(
                from_unix(existing.scheduled_at), existing.cost_ewma_ms, new.plan_weight
            )
            fields[JobField.EFFECTIVE_AT] = format_ts(to_unix(reweighed_at))
        tenant = stored_tenant(jid, old_tenant or new.tenant)
        job_changes.append(JobChange(jid, tenant, fields, place, not new.enabled, sa, ea))
    removals = tuple(
        JobRemoval(j, stored_tenant(j, old_tenant)) for j in sorted(set(old_ids) - set(new_ids))
    )
    return CheckChange(
        new.uid,
        "put",
        expect,
        old_tenant,
        new.tenant,
        encode_check(new),
        removals,
        tuple(job_changes),
    )


# --- the store (I/O) --------------------------------------------------------------------------


class CheckStore:
    """Create, update, delete, read and list checks; every write reconciles the jobs."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        settings: Settings,
        params: Params | None = None,
        registry: Registry = SHARED,
    ) -> None:
        """``registry`` knows the kinds definitions are validated against: an app's
        (:meth:`for_app`), else the shared kinds every app knows."""
        self.redis = client
        self.keys = keys
        self.settings = settings
        self.params = params or Params.from_settings(settings)
        self.registry = registry

    @classmethod
    def from_settings(cls, settings: Settings, registry: Registry = SHARED) -> CheckStore:
        from celery_app.redis.client import get_redis

        client = get_redis(settings.redis_url, settings)
        return cls(client, state_keys(settings), settings, registry=registry)

    @classmethod
    def for_app(cls, app: Celery) -> CheckStore:
        """The store of an app: its settings, its Redis and the kinds its registry knows."""
        from celery_app.factory import settings_of

        return cls.from_settings(settings_of(app), registry_of(app))

    # reads
    def get(self, uid: str) -> StoredCheck | None:
        h = self.redis.hgetall(self.keys.check(uid))
        return decode_check(uid, cast("dict[str, str]", h)) if h else None  # decode_responses=True

    def require(self, uid: str) -> StoredCheck:
        found = self.get(uid)
        if found is None:
            raise CheckNotFound(uid)
        return found

    def uids(self, tenant: str | None = None) -> builtins.list[str]:
        """The uids of every check (of ``tenant``), sorted, from every partition."""
        return listed_uids(self.redis, self.keys, tenant)

    def list(self, tenant: str | None = None) -> list[CheckDefinition]:
        uids = self.uids(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for uid in uids:
            pipe.hgetall(self.keys.check(uid))
        return [
            decode_check(uid, h).definition
            for uid, h in zip(uids, pipe.execute(), strict=True)
            if h
        ]

    def jobs(self, uid: str) -> builtins.list[JobState]:  # `list` is the method above
        stored = self.require(uid)
        return [j for j in read_jobs(self.redis, self.keys, stored.definition.job_ids()) if j]

    # writes
    def _apply(self, changes: Sequence[CheckChange], client: Any = None) -> Any:
        """One store.lua call (queued when ``client`` is a pipeline): ["ok"] or the refusal."""
        keys, payload = encode_changes(self.keys, changes)
        return run_script(client or self.redis, "store", keys=keys, args=[payload])

    def _read_jobs(self, job_ids: Iterable[str]) -> dict[str, JobState | None]:
        ids = sorted(set(job_ids))
        return dict(zip(ids, read_jobs(self.redis, self.keys, ids), strict=True))

    def _create(self, definitions: Sequence[CheckDefinition], when: datetime) -> builtins.list[str]:
        """Create in one call; a batch refused as stale (a leftover job hash holds another
        tenant) is planned again with the jobs read."""
        status = self._apply([plan_change(None, d, {}, when, self.params) for d in definitions])
        if status[0] == StoreStatus.STALE:
            jobs = self._read_jobs(j for d in definitions for j in d.job_ids())
            changes = [plan_change(None, d, jobs, when, self.params) for d in definitions]
            status = self._apply(changes)
        return status

    def _now(self, now: datetime | None) -> datetime:
        return now or from_unix(time.time())

    def create(self, now: datetime | None = None, **raw: Any) -> CheckDefinition:
        """Validate and create a check; CheckExists if the uid is taken."""
        defn = validate_definition(self.settings, registry=self.registry, **raw)
        status = self._create([defn], self._now(now))
        if status[0] == StoreStatus.EXISTS:
            raise CheckExists(f"check {defn.uid!r} already exists (use update)")
        return defn

    def create_many(
        self, definitions: Iterable[CheckDefinition], now: datetime | None = None, chunk: int = 500
    ) -> int:
        """Create many already-validated checks, ``chunk`` of one partition per Lua call (a
        batch is all or nothing; up to 8 calls per round trip); CheckExists names the first uid
        that was taken."""
        when = self._now(now)
        count = 0
        batches: list[list[CheckDefinition]] = []
        batch: list[CheckDefinition] = []

        def flush() -> None:
            pipe = self.redis.pipeline(transaction=False)
            for b in batches:
                self._apply([plan_change(None, d, {}, when, self.params) for d in b], pipe)
            for b, status in zip(batches, pipe.execute(), strict=True):
                if status[0] == StoreStatus.STALE:
                    status = self._create(b, when)
                if status[0] != StoreStatus.OK:
                    raise CheckExists(f"check {status[1]!r} already exists")
            batches.clear()

        for group in by_partition(self.keys, definitions, lambda d: d.uid):
            for defn in group:
                batch.append(defn)
                count += 1
                if len(batch) >= chunk:
                    batches.append(batch)
                    batch = []
                    if len(batches) >= 8:
                        flush()
            if batch:
                batches.append(batch)
                batch = []
        if batches:
            flush()
        return count

    def _write(self, uid: str, make: Any, now: datetime | None) -> CheckDefinition | None:
        for _ in range(_RETRIES):
            old = self.require(uid)
            new = make(old.definition)
            ids = old.definition.job_ids() + (new.job_ids() if new else [])
            release_quarantined(self.redis, self.keys, ids)  # rebuilt by this write
            jobs = self._read_jobs(ids)
            status = self._apply([plan_change(old, new, jobs, self._now(now), self.params)])
            if status[0] == StoreStatus.OK:
                return new
            if status[0] == StoreStatus.MISSING:
                raise CheckNotFound(uid)
            # conflict or stale: it changed while we planned; read it again
        raise ConcurrentUpdate(f"check {uid!r} changed {_RETRIES} times while being updated")

    def update(self, uid: str, now: datetime | None = None, **changes: Any) -> CheckDefinition:
        """Change some fields (validated as a whole); reconcile its jobs."""
        if "uid" in changes and changes["uid"] != uid:
            raise CheckFieldError("uid", "cannot be changed (delete and add instead)")

        def make(old: CheckDefinition) -> CheckDefinition:
            merged = old.as_dict() | {k: v for k, v in changes.items() if k != "uid"}
            return validate_definition(self.settings, registry=self.registry, **merged)

        result = self._write(uid, make, now)
        assert result is not None
        return result

    def replace(self, defn: CheckDefinition, now: datetime | None = None) -> CheckDefinition:
        """Make the existing check ``defn.uid`` exactly ``defn`` (already validated)."""
        result = self._write(defn.uid, lambda old: defn, now)
        assert result is not None
        return result

    def set_enabled(self, uid: str, enabled: bool, now: datetime | None = None) -> CheckDefinition:
        """Disable (jobs leave every index, EWMAs kept) or enable (jobs placed at their tick)."""
        result = self._write(uid, lambda old: replace(old, enabled=enabled), now)
        assert result is not None
        return result

    def delete(self, uid: str) -> bool:
        """Delete the check, its jobs, leases, ready entries, results, maintenance windows and
        notification targets; False if absent."""
        try:
            self._write(uid, lambda old: None, None)
        except CheckNotFound:
            return False
        MaintenanceStore(self.redis, self.keys).drop_scope(maintenance_scope(uid=uid))
        NotifyStore(self.redis, self.keys).drop_scope(maintenance_scope(uid=uid))
        return True
