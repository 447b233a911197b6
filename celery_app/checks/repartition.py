"""Move the check half, in place, from the partition count it was built with to the one set
(``CHECKBEAT_CHECK_PARTITIONS``): ``checks reconcile`` runs it before it rebuilds the jobs.

What moves, and how:

- each check's own keys (its definition, state, transition and result streams, last results,
  the notification outcomes of its transitions, and its job in every region, EWMAs and counters
  kept) are copied to their name in the new partition (``DUMP``/``RESTORE``: any key type,
  across slots) and the old name deleted; a job leaves its lease and quarantine record behind
  (the reconcile places it at its next tick);
- what lives per partition is read whole first, its old keys deleted, then written into the new
  partitions: token buckets (set again, so each new partition gets its share), maintenance
  windows and the version, notification targets, undelivered transitions (the outbox, their
  payloads, claim counts and failed deliveries, each to its check's partition), the maintenance
  holds and the tenants' transition streams (merged by entry id);
- indexes (due, ready, leases, held, the check sets) and worker registrations are not carried:
  the reconcile rebuilds the first from the jobs, workers register again when they start.

Why beats and workers must be stopped first: a running one writes the old names (its
registration, its completions) while the keys move. A worker still registered is refused by
name, as its registration lasts only its heartbeat's TTL after it stops.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from celery_app.checks.definition import decode_check
from celery_app.checks.layout import stored_partitions
from celery_app.checks.maintenance import MaintenanceStore
from celery_app.checks.notify import NotifyStore, NotifyTarget
from celery_app.checks.ratelimit import RateLimit, get_rate_limit, set_rate_limit
from celery_app.checks.repair import check_uids
from celery_app.errors import CheckbeatError
from celery_app.redis.schema import CheckField, JobField, Keys, TransitionField, job_id
from scheduling_core import LANE_FAST, LANE_SLOW

LANES = (LANE_FAST, LANE_SLOW)


class WorkersStillRunning(CheckbeatError, RuntimeError):
    """A check worker is still registered: it would write the old names while they move."""

    field = "workers"


@dataclass(frozen=True)
class Repartitioned:
    """What a move did: the counts before and after, and how many checks moved."""

    before: int
    after: int
    checks: int


@dataclass
class _Carried:
    """What lives per partition, read whole before the old keys go."""

    limits: list[RateLimit]
    windows: list[Any]
    outbox: dict[str, float]
    payloads: dict[str, str]
    claims: dict[str, str]
    failed: dict[str, str]
    holds: dict[str, float]
    streams: dict[str, list[tuple[str, dict[str, str]]]]
    targets: list[NotifyTarget] = field(default_factory=list)


def repartition(client: Any, keys: Keys, regions: list[str]) -> Repartitioned | None:
    """Move the check half to ``keys.partitions`` from the count it records; None when they
    are the same. :class:`WorkersStillRunning` (nothing moved) while a worker is registered."""
    before = stored_partitions(client, keys) or 1
    if before == keys.partitions:
        return None
    old = Keys(keys.prefix, keys.cluster, partitions=before)
    live = sorted(
        {
            host
            for part in old.every_partition()
            for r in regions
            for host in _workers(client, part, r)
        }
    )
    if live:
        raise WorkersStillRunning(
            f"workers: {len(live)} check worker(s) still registered ({', '.join(live[:5])}): "
            "stop every worker and beat first (a registration lasts its heartbeat's TTL)"
        )
    definitions = {
        uid: h
        for part in old.every_partition()
        for uid in check_uids(client, part)
        if (h := client.hgetall(old.check(uid)))
    }
    tenants = sorted({h.get(CheckField.TENANT, "") for h in definitions.values()} - {""})
    carried = _read_carried(client, old, tenants)
    moved = 0
    for uid, h in sorted(definitions.items()):
        moved += _move_check(client, old, keys, uid, h)
    _drop_partition_keys(client, old, keys, regions, tenants)
    _write_carried(client, keys, carried)
    client.set(keys.check_layout(), keys.partitions)
    return Repartitioned(before, keys.partitions, moved)


def _workers(client: Any, part: Keys, region: str) -> list[str]:
    hosts = sorted(client.smembers(part.region_workers(region)))
    return [h for h in hosts if client.exists(part.worker(h))]


def _read_carried(client: Any, old: Keys, tenants: list[str]) -> _Carried:
    limited = sorted(
        {t for part in old.every_partition() for t in client.smembers(part.rate_limited_tenants())}
    )
    limits = [b for t in limited if (b := get_rate_limit(client, old, t)) is not None]
    carried = _Carried(
        limits=limits,
        windows=MaintenanceStore(client, old).list(),
        targets=NotifyStore(client, old).list(),
        outbox={}, payloads={}, claims={}, failed={}, holds={}, streams={},
    )  # fmt: skip
    for part in old.every_partition():
        carried.outbox.update(client.zrange(part.transition_outbox(), 0, -1, withscores=True))
        carried.payloads.update(client.hgetall(part.transition_payloads()))
        carried.claims.update(client.hgetall(part.transition_claims()))
        carried.failed.update(client.hgetall(part.transition_failed()))
        carried.holds.update(client.zrange(part.maintenance_held(), 0, -1, withscores=True))
        for tenant in tenants:
            entries = client.xrange(part.tenant_transitions(tenant))
            carried.streams.setdefault(tenant, []).extend(entries)
    return carried


def _move(client: Any, source: str, target: str) -> bool:
    """Copy ``source`` to ``target`` (any type, its TTL dropped) and delete it."""
    if source == target:
        return client.exists(source) == 1
    dump = client.dump(source)
    if dump is None:
        return False
    client.restore(target, 0, dump, replace=True)
    client.delete(source)
    return True


def _move_check(client: Any, old: Keys, new: Keys, uid: str, definition: dict[str, str]) -> int:
    """Move one check's own keys to its new partition; 1 if its definition moved."""
    regions = decode_check(uid, definition).definition.regions
    for _entry_id, fields in client.xrange(old.check_transitions(uid)):
        tid = fields.get(TransitionField.ID) or ""
        if tid:
            _move(client, old.notify_outcomes(tid), new.notify_outcomes(tid))
    for name in ("check_state", "check_transitions", "results", "last_result"):
        _move(client, getattr(old, name)(uid), getattr(new, name)(uid))
    for region in regions:
        job = job_id(uid, region)
        if _move(client, old.job(job), new.job(job)):
            client.hdel(
                new.job(job), JobField.LEASE_TOKEN, JobField.LEASE_EXPIRY, JobField.QUARANTINE
            )
    return int(_move(client, old.check(uid), new.check(uid)))


def _drop_partition_keys(
    client: Any, old: Keys, new: Keys, regions: list[str], tenants: list[str]
) -> None:
    """Delete every per-partition key of the old count (the new count's, where a name is the
    same, is written again from what was carried or rebuilt by the reconcile)."""
    names: set[str] = {old.at(0).maintenance_scopes(), old.at(0).notify_scopes()}
    names |= {
        old.at(0).notify_targets(t_scope) for t_scope in client.smembers(old.at(0).notify_scopes())
    }
    names |= {
        old.at(0).maintenance(w_scope)
        for w_scope in client.smembers(old.at(0).maintenance_scopes())
    }
    for part in old.every_partition():
        names |= {
            part.due(), part.checks(), part.quarantine(),
            part.rate_limited_tenants(), part.claim_tenants_version(), part.transition_outbox(),
            part.transition_payloads(), part.transition_claims(), part.transition_failed(),
            part.maintenance_held(), part.maintenance_version(),
        }  # fmt: skip
        for tenant in tenants:
            names |= {part.tenant_checks(tenant), part.tenant_transitions(tenant),
                      part.rate_limit(tenant)}  # fmt: skip
        for region in regions:
            held = set(client.smembers(part.held_tenants(region))) | set(tenants)
            names |= {part.held_tenants(region), part.region_workers(region)}
            for lane in LANES:
                names |= {part.ready(region, lane), part.leases(region, lane)}
                names |= {part.held(region, lane, tenant) for tenant in held}
    for name in sorted(names):  # one by one: on a cluster the names are in many slots
        client.delete(name)


def _write_carried(client: Any, new: Keys, carried: _Carried) -> None:
    for bucket in carried.limits:
        set_rate_limit(client, new, bucket.tenant, per_minute=bucket.per_minute, burst=bucket.burst)
    if carried.windows:
        MaintenanceStore(client, new).replace_many([], carried.windows)
    if carried.targets:
        NotifyStore(client, new).replace_many([], carried.targets)
    for tid, score in carried.outbox.items():
        part = new.of_transition(tid)
        client.zadd(part.transition_outbox(), {tid: score})
        if tid in carried.payloads:
            client.hset(part.transition_payloads(), tid, carried.payloads[tid])
        if tid in carried.claims:
            client.hset(part.transition_claims(), tid, carried.claims[tid])
    for tid, failure in carried.failed.items():
        client.hset(new.of_transition(tid).transition_failed(), tid, failure)
    for uid, until in carried.holds.items():
        client.zadd(new.of_check(uid).maintenance_held(), {uid: until})
    for tenant, entries in carried.streams.items():
        _merge_stream(client, new, tenant, entries)


def _merge_stream(
    client: Any, new: Keys, tenant: str, entries: list[tuple[str, dict[str, str]]]
) -> None:
    """A tenant's transitions, from every old partition's stream, into the stream of each
    entry's check's new partition, in entry-id order (ids kept; one taken twice by two old
    streams in the same millisecond gets the next sequence number)."""
    last: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for entry_id, fields in sorted(entries, key=lambda e: _id(e[0])):
        uid = fields.get(TransitionField.ID, "").rpartition("#")[0]
        key = new.of_check(uid).tenant_transitions(tenant)
        ms, seq = _id(entry_id)
        if (ms, seq) <= last[key]:
            ms, seq = last[key][0], last[key][1] + 1
        client.xadd(key, fields, id=f"{ms}-{seq}")
        last[key] = (ms, seq)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
