"""Checks as code against the store: the diff a validated file makes (create / update / delete,
rate limits), writing it in batches, and exporting the store in the same format.

Why batches: 100,000 checks must apply within a minute, so creates, updates and deletes are
planned with :func:`~celery_app.checks.store.plan_change` (the store's one planner) and sent as
``store.lua`` calls of 500 checks, 8 calls a round trip, from a helper thread while the next
group is planned. Each batch is guarded by the versions read when the diff was made (a create
by the check's absence): a batch refused because a check changed meanwhile writes nothing and
is applied again check by check through the store (the file wins).

A second apply of the same file changes nothing: a check is compared by its normalised
definition (the kind's validator normalised both), a rate limit by its rate and burst, a
maintenance window by its identity (scope, cron, duration, timezone; its id is the store's), a
notification target by its scope and URL (a URL masked as ``checks export`` writes it stands for
the stored target of its scope that shows so).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import yaml

from celery_app.checks.changes import StoreStatus, encode_changes
from celery_app.checks.definition import CheckDefinition, StoredCheck, decode_check
from celery_app.checks.jobs import from_unix, read_jobs
from celery_app.checks.kinds import get_kind
from celery_app.checks.maintenance import MaintenanceStore, Window
from celery_app.checks.manifest import FORMAT_VERSION, Manifest, ManifestError, Problem
from celery_app.checks.notify import NotifyStore, NotifyTarget
from celery_app.checks.ratelimit import clear_rate_limit, get_rate_limit, set_rate_limit
from celery_app.checks.redaction import (
    MASK,
    holds_mask,
    is_masked_target,
    masked_paths,
    redact_config,
    redact_target,
    restore_masked,
)
from celery_app.checks.scoped_store import Item
from celery_app.checks.store import CheckStore, plan_change
from celery_app.errors import CheckFieldError
from celery_app.gc_pause import gc_paused
from celery_app.redis.schema import by_partition, maintenance_scope
from celery_app.redis.scripts import run_script

#: Checks per Lua call, and Lua calls per round trip, of updates and deletes (as create_many).
CHUNK = 500
CALLS_PER_ROUND_TRIP = 8
_READ_CHUNK = 5000
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
Bucket = tuple[float, float]


@dataclass(frozen=True)
class RateChange:
    tenant: str
    old: Bucket | None
    new: Bucket | None

    def line(self) -> str:
        sign = "-" if self.new is None else ("+" if self.old is None else "~")
        return f"{sign} rate limit {self.tenant}: {_bucket(self.old)} -> {_bucket(self.new)}"


@dataclass
class Plan:
    """What applying a file would do; empty when the store already matches it."""

    creates: list[CheckDefinition] = field(default_factory=list)
    updates: list[tuple[StoredCheck, CheckDefinition]] = field(default_factory=list)
    deletes: list[StoredCheck] = field(default_factory=list)
    rate_changes: list[RateChange] = field(default_factory=list)
    window_adds: list[Window] = field(default_factory=list)
    window_removes: list[Window] = field(default_factory=list)
    target_adds: list[NotifyTarget] = field(default_factory=list)
    target_removes: list[NotifyTarget] = field(default_factory=list)
    unchanged: int = 0

    @property
    def empty(self) -> bool:
        return not (
            self.creates
            or self.updates
            or self.deletes
            or self.rate_changes
            or self.window_adds
            or self.window_removes
            or self.target_adds
            or self.target_removes
        )

    def lines(self) -> Iterator[str]:
        """The diff, one line a change (targets and credential headers redacted)."""
        for d in self.creates:
            yield (
                f"+ create {d.uid} ({d.tenant}: {d.kind} {redact_target(d.target)} every "
                f"{d.period}s in {','.join(d.regions)})"
            )
        for old, new in self.updates:
            yield f"~ update {new.uid}: {'; '.join(field_changes(old.definition, new))}"
        for old in self.deletes:
            d = old.definition
            yield f"- delete {d.uid} ({d.tenant}: {d.kind} {redact_target(d.target)})"
        for change in self.rate_changes:
            yield change.line()
        for w in self.window_removes:
            yield f"- window {w.scope}: {_window_text(w)} (id {w.id})"
        for w in self.window_adds:
            yield f"+ window {w.scope}: {_window_text(w)}"
        for t in self.target_removes:
            yield f"- notify {t.scope}: {t.shown} (id {t.id})"
        for t in self.target_adds:
            yield f"+ notify {t.scope}: {t.shown}"

    def summary(self) -> str:
        return (
            f"{len(self.creates)} to create, {len(self.updates)} to update, "
            f"{len(self.deletes)} to delete, {len(self.rate_changes)} rate limit change(s), "
            f"{len(self.window_adds)} window(s) to add, {len(self.window_removes)} to remove, "
            f"{len(self.target_adds)} notification target(s) to add, "
            f"{len(self.target_removes)} to remove, {self.unchanged} unchanged"
        )


def _window_text(w: Window) -> str:
    return f"{w.cron!r} for {w.duration_s}s in {w.timezone}"


def window_identity(w: Window) -> tuple[str, str, int, str]:
    """What makes two windows the same for apply: the id is left out (the file has none)."""
    return (w.scope, w.cron, w.duration_s, w.timezone)


def _bucket(bucket: Bucket | None) -> str:
    return "none" if bucket is None else f"{bucket[0]:g}/min burst {bucket[1]:g}"


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else f"{text[:57]}..."


def field_changes(old: CheckDefinition, new: CheckDefinition) -> list[str]:
    """``field: old -> new`` for each field that differs (config by key, secrets redacted)."""
    before, after = old.as_dict(), new.as_dict()
    out = []
    for name in before:
        if name in ("config", "uid") or before[name] == after[name]:
            continue
        a, b = before[name], after[name]
        if name == "target":
            a, b = redact_target(a), redact_target(b)
        out.append(f"{name}: {_shown(a)} -> {_shown(b)}")
    a_conf, b_conf = redact_config(before["config"]), redact_config(after["config"])
    for key in sorted(set(a_conf) | set(b_conf)):
        if before["config"].get(key) != after["config"].get(key):
            out.append(f"config.{key}: {_shown(a_conf.get(key))} -> {_shown(b_conf.get(key))}")
    return out


# --- reading the store ---------------------------------------------------------------------------


def read_stored(store: CheckStore, tenant: str | None = None) -> dict[str, StoredCheck]:
    """Every stored check (of one tenant) with its version, read in pipelined chunks."""
    keys = store.keys
    uids = store.uids(tenant)
    out: dict[str, StoredCheck] = {}
    for start in range(0, len(uids), _READ_CHUNK):
        part = uids[start : start + _READ_CHUNK]
        pipe = store.redis.pipeline(transaction=False)
        for uid in part:
            pipe.hgetall(keys.check(uid))
        for uid, h in zip(part, pipe.execute(), strict=True):
            if h:
                out[uid] = decode_check(uid, h)
    return out


def plan_manifest(
    store: CheckStore, manifest: Manifest, *, prune: bool = False, source: str = "<file>"
) -> Plan:
    """The diff between the store and ``manifest``. With ``prune``, stored checks of the file's
    tenants (:meth:`Manifest.scope`) that the file does not list are deleted, and so are the
    rate limits of tenants in its ``tenants`` section that name none. Windows: see
    :func:`_plan_windows`.

    A secret written as the export's mask (``***``: ``checks export`` without
    ``--include-secrets``) stands for the stored check's secret in that place
    (:func:`~celery_app.checks.redaction.restore_masked`), so a masked export applies to its
    store without a change; a mask with no stored secret behind it refuses the file
    (ManifestError naming ``source``), nothing written: ``***`` is not a credential to probe
    with."""
    with gc_paused():
        return _plan(store, manifest, prune, source)


def _unmasked(
    defn: CheckDefinition, index: int, old: StoredCheck | None, problems: list[Problem]
) -> CheckDefinition:
    """``defn`` with the export's masks given the stored secrets back; a problem for each mask
    left."""
    if not holds_mask(defn.target, defn.config):
        return defn
    if old is not None:
        target, config = restore_masked(
            defn.target, defn.config, old.definition.target, old.definition.config
        )
        defn = dataclasses.replace(defn, target=target, config=config)
    why = (
        f"is {MASK!r}, the mask `checks export` writes, and the store has no secret there to "
        "keep: write the value (or export with --include-secrets)"
    )
    if is_masked_target(defn.target):
        problems.append(Problem(("checks", index, "target"), why, uid=defn.uid))
    for path in masked_paths(defn.config):
        problems.append(Problem(("checks", index, f"config.{path}"), why, uid=defn.uid))
    return defn


def _plan(store: CheckStore, manifest: Manifest, prune: bool, source: str) -> Plan:
    stored = read_stored(store)
    plan = Plan()
    listed = set()
    problems: list[Problem] = []
    for index, given in enumerate(manifest.checks):
        old = stored.get(given.uid)
        defn = _unmasked(given, index, old, problems)
        listed.add(defn.uid)
        if old is None:
            plan.creates.append(defn)
        elif old.definition != defn:
            plan.updates.append((old, defn))
        else:
            plan.unchanged += 1
    if problems:
        raise ManifestError(source, problems)
    if prune:
        scope = manifest.scope()
        plan.deletes = [
            old
            for uid, old in sorted(stored.items())
            if uid not in listed and old.definition.tenant in scope
        ]
    for name, spec in sorted(manifest.tenants.items()):
        current = get_rate_limit(store.redis, store.keys, name)
        now = None if current is None else (current.per_minute, current.burst)
        if spec.rate_limit is not None and now != spec.rate_limit:
            plan.rate_changes.append(RateChange(name, now, spec.rate_limit))
        elif spec.rate_limit is None and now is not None and prune:
            plan.rate_changes.append(RateChange(name, now, None))
    _plan_windows(store, manifest, prune, plan)
    _plan_targets(store, manifest, prune, plan, source)
    return plan


def _plan_windows(store: CheckStore, manifest: Manifest, prune: bool, plan: Plan) -> None:
    """Windows the file lists and the store lacks are added. A scope the file gives a
    ``maintenance`` key (even ``[]``) is made to match it, so stored windows it omits are
    removed, as a listed check's omitted fields are reset. With ``prune`` also every other
    scope of the file (its checks', its tenants', the pruned checks') loses what it omits."""
    stored: dict[tuple[str, str, int, str], list[Window]] = {}
    for w in sorted(MaintenanceStore(store.redis, store.keys).list(), key=lambda w: w.id):
        stored.setdefault(window_identity(w), []).append(w)
    for w in manifest.windows:
        same = stored.get(window_identity(w))
        if same:
            same.pop(0)  # already stored: kept as it is (its id too)
        else:
            plan.window_adds.append(w)
    plan.window_removes = sorted(
        _left_in(stored.values(), manifest.window_scopes, manifest, prune, plan),
        key=lambda w: (window_identity(w), w.id),
    )


def _plan_targets(
    store: CheckStore, manifest: Manifest, prune: bool, plan: Plan, source: str
) -> None:
    """Notification targets as windows are planned (:func:`_plan_windows`), by (scope, URL);
    a URL as ``checks export`` shows it keeps the stored target of its scope that shows so
    (the shown form may differ without a secret: Apprise writes its own); a masked one with
    no such target is refused."""
    stored: dict[str, list[NotifyTarget]] = {}
    for t in sorted(NotifyStore(store.redis, store.keys).list(), key=lambda t: t.id):
        stored.setdefault(t.scope, []).append(t)
    problems: list[Problem] = []
    for t in manifest.targets:
        left = stored.get(t.scope, [])
        same = next((s for s in left if s.url == t.url), None)
        if same is None:  # as exported: the stored target it stands for
            same = next((s for s in left if s.shown == t.url), None)
            if same is None and not t.id:  # masked, and nothing stored behind the mask
                where = (*_scope_path(t.scope), "notify")
                problems.append(
                    Problem(
                        where,
                        f"{t.url!r} is masked as `checks export` writes it, and the store has "
                        "no target of this scope it stands for: write the URL (or export with "
                        "--include-secrets)",
                    )
                )
                continue
        if same is not None:
            left.remove(same)  # already stored: kept as it is (its id too)
        else:
            plan.target_adds.append(dataclasses.replace(t, id=secrets.token_hex(4)))
    if problems:
        raise ManifestError(source, problems)
    plan.target_removes = sorted(
        _left_in(stored.values(), manifest.target_scopes, manifest, prune, plan),
        key=lambda t: (t.scope, t.id),
    )


def _left_in(
    left: Iterable[list[Item]], given: Iterable[str], manifest: Manifest, prune: bool, plan: Plan
) -> list[Item]:
    """The stored windows or targets the file did not keep (``left``), in the scopes it
    governs: those it gives the key (``given``), and with ``prune`` every other scope of the
    file (its checks', its tenants', the pruned checks')."""
    scopes = set(given)
    if prune:
        scopes |= manifest.pruned_window_scopes()
        scopes |= {maintenance_scope(uid=old.definition.uid) for old in plan.deletes}
    return [item for items in left for item in items if item.scope in scopes]


def _scope_path(scope: str) -> tuple[str, ...]:
    kind, _, name = scope.partition(":")
    return ("tenants", name) if kind == "tenant" else ("checks", f"(uid {name})")


# --- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    created: int
    updated: int
    deleted: int
    rate_limits: int
    windows_added: int
    windows_removed: int
    seconds: float
    targets_added: int = 0
    targets_removed: int = 0


Pair = tuple[StoredCheck | None, CheckDefinition | None]


class _Sender:
    """Sends planned batches from a helper thread while the caller plans the next ones, so
    Redis runs one group of Lua calls while Python encodes the next (the two overlap)."""

    def __init__(self, store: CheckStore) -> None:
        self.store = store
        self.refused: list[Sequence[Pair]] = []
        self._queue: queue.Queue[list[tuple[Sequence[Pair], list[str], str]] | None]
        self._queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="checks-apply", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (group := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                pipe = self.store.redis.pipeline(transaction=False)
                for _batch, keys, payload in group:
                    run_script(pipe, "store", keys=keys, args=[payload])
                for (batch, _k, _p), status in zip(group, pipe.execute(), strict=True):
                    if status[0] != StoreStatus.OK:
                        self.refused.append(batch)
            except BaseException as exc:  # re-raised in the caller by close()
                self._error = exc

    def send(self, group: list[tuple[Sequence[Pair], list[str], str]]) -> None:
        self._queue.put(group)

    def close(self) -> list[Sequence[Pair]]:
        """Wait for every batch; the batches Redis refused (nothing of them was written)."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.refused


def _write_pairs(store: CheckStore, pairs: Sequence[Pair], when: datetime) -> None:
    """Creates (old None), updates and deletes (new None) in batches of :data:`CHUNK`, groups of
    :data:`CALLS_PER_ROUND_TRIP` a round trip; a refused batch is redone check by check."""
    sender = _Sender(store)
    try:
        for start in range(0, len(pairs), CHUNK * CALLS_PER_ROUND_TRIP):
            part = pairs[start : start + CHUNK * CALLS_PER_ROUND_TRIP]
            ids = sorted(
                {j for old, _new in part if old is not None for j in _ids(old.definition)}
                | {j for old, new in part if old is not None for j in _ids(new)}
            )
            jobs = dict(zip(ids, read_jobs(store.redis, store.keys, ids), strict=True))
            group: list[tuple[Sequence[Pair], list[str], str]] = []
            for same_partition in by_partition(store.keys, part, _uid_of_pair):
                for i in range(0, len(same_partition), CHUNK):
                    batch = same_partition[i : i + CHUNK]
                    changes = [
                        plan_change(old, new, jobs, when, store.params) for old, new in batch
                    ]
                    keys, payload = encode_changes(store.keys, changes)
                    group.append((batch, keys, payload))
            sender.send(group)
    finally:
        refused = sender.close()
    for refused_batch in refused:  # changed since the diff (or a stale job hash): the file wins
        for old, new in refused_batch:
            if new is None:
                assert old is not None
                store.delete(old.definition.uid)
            elif store.get(new.uid) is None:
                store.create_many([new], now=when)
            else:
                store.replace(new, now=when)


def _uid_of_pair(pair: Pair) -> str:
    old, new = pair
    if new is not None:
        return new.uid
    assert old is not None  # a pair has at least one side
    return old.definition.uid


def _ids(defn: CheckDefinition | None) -> list[str]:
    return defn.job_ids() if defn is not None else []


def apply_plan(store: CheckStore, plan: Plan, now: datetime | None = None) -> Applied:
    """Write ``plan``: creates, updates and deletes in batches, then the rate limits."""
    with gc_paused():
        return _apply(store, plan, now)


def _apply(store: CheckStore, plan: Plan, now: datetime | None) -> Applied:
    started = time.perf_counter()
    when = now or from_unix(time.time())
    pairs: list[Pair] = [(None, d) for d in plan.creates]
    pairs += [(old, new) for old, new in plan.updates]
    pairs += [(old, None) for old in plan.deletes]
    _write_pairs(store, pairs, when)
    for change in plan.rate_changes:
        if change.new is None:
            clear_rate_limit(store.redis, store.keys, change.tenant)
        else:
            per_minute, burst = change.new
            set_rate_limit(
                store.redis, store.keys, change.tenant, per_minute=per_minute, burst=burst
            )
    # after the checks, so a check's window never names a check not (yet) stored
    MaintenanceStore(store.redis, store.keys).replace_many(plan.window_removes, plan.window_adds)
    NotifyStore(store.redis, store.keys).replace_many(plan.target_removes, plan.target_adds)
    return Applied(
        len(plan.creates),
        len(plan.updates),
        len(plan.deletes),
        len(plan.rate_changes),
        len(plan.window_adds),
        len(plan.window_removes),
        time.perf_counter() - started,
        len(plan.target_adds),
        len(plan.target_removes),
    )


# --- export ------------------------------------------------------------------------------------


class _Defaults:
    """Each kind's default config, to leave defaults out of an export (kept when leaving them
    out would not normalise back to the same config)."""

    def __init__(self, store: CheckStore) -> None:
        self.store = store
        self._cache: dict[str, Mapping[str, Any] | None] = {}

    def _normalise(self, defn: CheckDefinition, config: dict[str, Any]) -> Any:
        kind = get_kind(self.store.registry, defn.kind)
        return kind.normalize(defn.target, config, self.store.settings)

    def minimal(self, defn: CheckDefinition) -> dict[str, Any]:
        config = dict(defn.config)
        if defn.kind not in self._cache:
            try:
                self._cache[defn.kind] = self._normalise(defn, {})
            except (CheckFieldError, ValueError, TypeError):
                self._cache[defn.kind] = None
        defaults = self._cache[defn.kind]
        if not defaults:
            return config
        missing = object()
        small = {k: v for k, v in config.items() if defaults.get(k, missing) != v}
        try:
            same = self._normalise(defn, small) == config
        except (CheckFieldError, ValueError, TypeError):
            same = False
        return small if same else config


def export_manifest(
    store: CheckStore, tenant: str | None = None, *, include_secrets: bool = False
) -> dict[str, Any]:
    """The store (one tenant's part) as a checks-as-code document: applying it to the same
    store changes nothing. Secrets are written as :data:`~celery_app.checks.redaction.MASK`
    (:func:`~celery_app.checks.redaction.redact_target`, ``redact_config``) unless
    ``include_secrets``; a masked file applied to the same store keeps the stored secrets
    (:func:`plan_manifest`)."""
    with gc_paused():
        return _export(store, tenant, include_secrets)


def _window_entries(windows: list[Window]) -> list[dict[str, Any]]:
    """A scope's windows as the file writes them, in a stable order (ids are not written)."""
    ordered = sorted(windows, key=window_identity)
    return [{"cron": w.cron, "duration": w.duration_s, "timezone": w.timezone} for w in ordered]


def _export(store: CheckStore, tenant: str | None, include_secrets: bool) -> dict[str, Any]:
    stored = read_stored(store, tenant)
    defaults = _Defaults(store)
    windows: dict[str, list[Window]] = {}
    for w in MaintenanceStore(store.redis, store.keys).list():
        windows.setdefault(w.scope, []).append(w)
    targets: dict[str, list[str]] = {}
    for t in NotifyStore(store.redis, store.keys).list():
        targets.setdefault(t.scope, []).append(t.url if include_secrets else t.shown)
    checks = []
    for _uid, item in sorted(stored.items()):
        d = item.definition
        entry: dict[str, Any] = {
            "uid": d.uid,
            "tenant": d.tenant,
            "kind": d.kind,
            "target": d.target if include_secrets else redact_target(d.target),
            "period": d.period,
            "regions": list(d.regions),
        }
        if d.region_spread is not None:
            entry["region_spread"] = d.region_spread
        if d.plan_weight:
            entry["plan_weight"] = d.plan_weight
        if not d.enabled:
            entry["enabled"] = False
        config = defaults.minimal(d)
        if config and not include_secrets:
            config = redact_config(config)
        if config:
            entry["config"] = config
        if own := windows.get(maintenance_scope(uid=d.uid)):
            entry["maintenance"] = _window_entries(own)
        if urls := targets.get(maintenance_scope(uid=d.uid)):
            entry["notify"] = sorted(urls)
        checks.append(entry)
    if tenant is not None:
        names = {tenant}
    else:
        names = set(cast("set[str]", store.redis.smembers(store.keys.rate_limited_tenants())))
        names |= {s.split(":", 1)[1] for s in windows if s.startswith("tenant:")}
        names |= {s.split(":", 1)[1] for s in targets if s.startswith("tenant:")}
    tenants: dict[str, Any] = {}
    for name in sorted(names):
        spec: dict[str, Any] = {}
        bucket = get_rate_limit(store.redis, store.keys, name)
        if bucket is not None:
            spec["rate_limit"] = {"per_minute": bucket.per_minute, "burst": bucket.burst}
        if own := windows.get(maintenance_scope(tenant=name)):
            spec["maintenance"] = _window_entries(own)
        if urls := targets.get(maintenance_scope(tenant=name)):
            spec["notify"] = sorted(urls)
        if spec:
            tenants[name] = spec
    document: dict[str, Any] = {"version": FORMAT_VERSION}
    if tenants:
        document["tenants"] = tenants
    document["checks"] = checks
    return document


def dump_manifest(document: Mapping[str, Any], *, include_secrets: bool = False) -> str:
    """The YAML text of an exported document (block style, keys in the documented order)."""
    secrets = (
        "# Secrets are included (--include-secrets): keep this file as you keep them.\n"
        if include_secrets
        else f"# Secrets are written as {MASK!r}: applying this file keeps the stored ones\n"
        "# (export with --include-secrets for a file that carries them).\n"
    )
    head = (
        "# checkbeat checks-as-code (docs/checks-as-code.md); apply with\n"
        "#   celery -A <app> checks apply -f <this file> [--dry-run] [--prune]\n" + secrets
    )
    with gc_paused():
        body = yaml.dump(document, Dumper=_DUMPER, sort_keys=False, allow_unicode=True, width=100)
    return head + body
