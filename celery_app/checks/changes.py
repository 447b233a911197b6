"""The changes ``store.lua`` applies, and their encoding with every key declared in KEYS.

Why a module of its own: the store (create, update, delete) and the repair plan the same kind of
change; this is the one place that knows which keys such a change touches, so ``store.lua``
builds none (it gets them in KEYS and refers to them by number).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from celery_app.redis.schema import Keys, split_job_id
from celery_app.redis.scripts import KeyTable
from scheduling_core import LANE_FAST, LANE_SLOW

MUST_NOT_EXIST = -1


class StoreStatus(StrEnum):
    """The first element of store.lua's reply (the second names the refused check)."""

    OK = "ok"
    EXISTS = "exists"  # a create found the check
    CONFLICT = "conflict"  # its version changed since it was read
    MISSING = "missing"  # an update or delete found no check
    STALE = "stale"  # a job hash holds another tenant than declared: read the jobs again


@dataclass(frozen=True)
class JobRemoval:
    """A job to delete with its index entries. ``tenant``: the tenant its hash holds (whose
    held indexes may hold it); store.lua refuses the batch as stale if the hash holds another."""

    job_id: str
    tenant: str


@dataclass(frozen=True)
class JobChange:
    """A job to write: ``fields`` copied from the definition; ``place`` puts it in the due index
    at ``scheduled_at`` / ``effective_at`` (unless leased); ``off`` takes it out of every index.
    ``tenant`` as in :class:`JobRemoval`."""

    job_id: str
    tenant: str
    fields: Mapping[str, str]
    place: bool
    off: bool
    scheduled_at: str | None = None
    effective_at: str | None = None


@dataclass(frozen=True)
class CheckChange:
    """One check's write: ``put`` (``fields`` = the check hash, ``tenant`` its tenant) or
    ``delete``; ``expect`` is the version it must have (:data:`MUST_NOT_EXIST` for a create)."""

    uid: str
    op: str  # "put" | "delete"
    expect: int
    old_tenant: str = ""
    tenant: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    remove: tuple[JobRemoval, ...] = ()
    jobs: tuple[JobChange, ...] = ()


def encode_changes(keys: Keys, changes: Sequence[CheckChange]) -> tuple[list[str], str]:
    """(KEYS, ARGV[1]) of one ``store.lua`` call applying ``changes`` atomically: all of one
    partition (:func:`by_partition`), whose keys it uses."""
    keys = keys.of_check(changes[0].uid)
    if any(keys.of_check(ch.uid) != keys for ch in changes):
        raise ValueError("one store call writes checks of one partition: group by_partition")
    table = KeyTable()
    encoded = [_change(keys, table, ch) for ch in changes]
    payload = {
        "checks": table(keys.checks()),
        "due": table(keys.due()),
        "wake": keys.dispatch_wake(),
        "changes": encoded,
    }
    return table.keys, json.dumps(payload, separators=(",", ":"))


def _job(keys: Keys, table: KeyTable, job_id: str, tenant: str) -> dict[str, Any]:
    _uid, region = split_job_id(job_id)
    return {
        "id": job_id,
        "key": table(keys.job(job_id)),
        "tenant": tenant,
        "held": [table(keys.held(region, lane, tenant)) for lane in (LANE_FAST, LANE_SLOW)],
        "ready": [table(keys.ready(region, lane)) for lane in (LANE_FAST, LANE_SLOW)],
        "leases": [table(keys.leases(region, lane)) for lane in (LANE_FAST, LANE_SLOW)],
    }


def _change(keys: Keys, table: KeyTable, ch: CheckChange) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uid": ch.uid,
        "check": table(keys.check(ch.uid)),
        "expect": ch.expect,
        "op": ch.op,
        "remove": [_job(keys, table, r.job_id, r.tenant) for r in ch.remove],
        "tenant_add": 0,
        "tenant_remove": 0,
    }
    moves_tenant = ch.op == "delete" or ch.old_tenant != ch.tenant
    if ch.old_tenant and moves_tenant:
        out["tenant_remove"] = table(keys.tenant_checks(ch.old_tenant))
    if ch.op == "delete":
        out["drop"] = [
            table(keys.results(ch.uid)),
            table(keys.last_result(ch.uid)),
            table(keys.check_state(ch.uid)),
            table(keys.check_transitions(ch.uid)),
        ]
        return out
    out["fields"] = dict(ch.fields)
    out["tenant_add"] = table(keys.tenant_checks(ch.tenant))
    jobs = []
    for job in ch.jobs:
        entry = _job(keys, table, job.job_id, job.tenant)
        entry.update(fields=dict(job.fields), place=job.place, off=job.off)
        if job.place:
            entry.update(sa=job.scheduled_at, ea=job.effective_at)
        jobs.append(entry)
    out["jobs"] = jobs
    return out
