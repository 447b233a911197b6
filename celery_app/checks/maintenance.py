"""Maintenance windows of a check or of a tenant: while one is open, checks keep running, their
results are marked and their transitions are held back until it closes.

A window starts at every firing of a cron spec (our parser, ``scheduling_core.cron``) in a
timezone and lasts a duration. Windows are stored per scope (``Keys.maintenance(scope)``, scope
``check:<uid>`` or ``tenant:<tenant>``) as JSON; the worker reads a check's and its tenant's at
each completion and tells ``complete.lua`` when the open window ends.
"""

from __future__ import annotations

import builtins
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis

from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.names import ID_RULE, TENANT_RULE, is_id, is_tenant
from celery_app.redis.schema import Keys, maintenance_scope
from scheduling_core import CronError, Schedule, parse
from scheduling_core.health import MAX_WINDOW, MIN_WINDOW, next_window_start, window_end


@lru_cache(maxsize=4096)
def _schedule(spec: str) -> Schedule:
    return parse(spec)


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


@dataclass(frozen=True)
class Window:
    """One maintenance window definition (build it with :func:`validate_window`)."""

    id: str
    scope: str
    cron: str
    duration_s: int
    timezone: str

    @property
    def duration(self) -> timedelta:
        return timedelta(seconds=self.duration_s)

    def end_if_open(self, now: datetime) -> datetime | None:
        """When this window ends if ``now`` is inside it, else None."""
        return window_end(_schedule(self.cron), self.duration, _zone(self.timezone), now)

    def next_start(self, now: datetime) -> datetime | None:
        return next_window_start(_schedule(self.cron), _zone(self.timezone), now)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "cron": self.cron,
            "duration_s": self.duration_s,
            "timezone": self.timezone,
        }

    def to_json(self) -> str:
        return json.dumps(
            {"cron": self.cron, "duration_s": self.duration_s, "timezone": self.timezone},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, window_id: str, scope: str, text: str) -> Window:
        data = json.loads(text)
        return cls(window_id, scope, data["cron"], int(data["duration_s"]), data["timezone"])


def validate_window(
    *,
    uid: str | None = None,
    tenant: str | None = None,
    cron: Any,
    duration: Any,
    timezone: Any,
    window_id: str | None = None,
) -> Window:
    """A valid window, or CheckFieldError naming the field (uid/tenant, cron, duration,
    timezone, id) and what is allowed. ``duration`` is in seconds (60 s to 7 days)."""
    if (uid is None) == (tenant is None):
        raise CheckFieldError("scope", "give exactly one of a check uid and a tenant")
    if uid is not None and (not isinstance(uid, str) or not is_id(uid)):
        raise CheckFieldError("uid", f"{uid!r} is not allowed: use {ID_RULE}")
    if tenant is not None and (not isinstance(tenant, str) or not is_tenant(tenant)):
        raise CheckFieldError("tenant", f"{tenant!r} is not allowed: use {TENANT_RULE}")
    if not isinstance(cron, str) or not cron.strip():
        raise CheckFieldError("cron", "must be a cron spec such as '0 3 * * sun'")
    try:
        schedule = _schedule(cron.strip())
    except CronError as exc:
        raise CheckFieldError("cron", str(exc)) from None
    if schedule.never:
        raise CheckFieldError("cron", f"{cron!r} never fires")
    low, high = int(MIN_WINDOW.total_seconds()), int(MAX_WINDOW.total_seconds())
    seconds: Any = duration
    if isinstance(seconds, str):
        try:
            seconds = float(seconds.strip())
        except ValueError:
            seconds = None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or seconds != seconds  # NaN
        or not low <= seconds <= high
        or not float(seconds).is_integer()
    ):
        raise CheckFieldError(
            "duration",
            f"must be whole seconds >= {low} and <= {high:,} (7 days), got {duration!r}",
        )
    if not isinstance(timezone, str) or not timezone:
        raise CheckFieldError("timezone", "must be an IANA timezone name such as Europe/Berlin")
    try:
        _zone(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise CheckFieldError(
            "timezone", f"unknown timezone {timezone!r}; use an IANA name such as Europe/Berlin"
        ) from None
    if window_id is None:
        window_id = secrets.token_hex(4)
    elif not isinstance(window_id, str) or not is_id(window_id):
        raise CheckFieldError("id", f"{window_id!r} is not allowed: use {ID_RULE}")
    scope = maintenance_scope(uid=uid, tenant=tenant)
    return Window(window_id, scope, cron.strip(), int(seconds), timezone)


def open_until(windows: Iterable[Window], now: datetime) -> datetime | None:
    """The latest end of the windows open at ``now`` (None: none is open)."""
    ends = [end for w in windows if (end := w.end_if_open(now)) is not None]
    return max(ends) if ends else None


def next_start(windows: Iterable[Window], now: datetime) -> tuple[datetime, Window] | None:
    """The next window start after ``now`` among ``windows``, and its window."""
    starts = [(start, w) for w in windows if (start := w.next_start(now)) is not None]
    return min(starts, key=lambda item: item[0]) if starts else None


def decode_windows(scope: str, h: Mapping[str, str]) -> list[Window]:
    return [Window.from_json(wid, scope, text) for wid, text in sorted(h.items())]


class MaintenanceStore:
    """Add, remove and list windows; read the windows that apply to a check."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys.at(0)  # windows and scopes live in the first partition

    def _bump(self, pipe: Any) -> str:
        """Queue a new version in the first partition, in the transaction that writes the
        windows; :meth:`_spread` gives the others the same after it."""
        version = secrets.token_hex(8)
        pipe.set(self.keys.maintenance_version(), version)
        return version

    def _spread(self, version: str) -> None:
        """Every other partition's version moves after the windows are written: a run that
        reads its partition's version then reads the windows never keeps stale ones."""
        for part in self.keys.every_partition()[1:]:
            self.redis.set(part.maintenance_version(), version)

    def add(self, window: Window) -> Window:
        """Store a validated window; a check scope must name an existing check."""
        if window.scope.startswith("check:"):
            uid = window.scope.split(":", 1)[1]
            if not self.redis.exists(self.keys.check(uid)):
                raise CheckNotFound(uid)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.maintenance(window.scope), window.id, window.to_json())
        pipe.sadd(self.keys.maintenance_scopes(), window.scope)
        version = self._bump(pipe)
        pipe.execute()
        self._spread(version)
        return window

    def remove(self, window_id: str) -> bool:
        """Remove the window with this id, whatever its scope; False when there is none."""
        for scope in self.scopes():
            pipe = self.redis.pipeline(transaction=True)
            pipe.hdel(self.keys.maintenance(scope), window_id)
            version = self._bump(pipe)
            pipe.exists(self.keys.maintenance(scope))
            removed, _, left = pipe.execute()
            self._spread(version)
            if removed:
                if not left:
                    self.redis.srem(self.keys.maintenance_scopes(), scope)
                return True
        return False

    def scopes(self) -> list[str]:
        return sorted(cast("set[str]", self.redis.smembers(self.keys.maintenance_scopes())))

    def drop_scope(self, scope: str) -> int:
        """Remove every window of ``scope`` (a deleted check's: a check created again under its
        uid must not inherit them); how many there were."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hlen(self.keys.maintenance(scope))
        pipe.delete(self.keys.maintenance(scope))
        pipe.srem(self.keys.maintenance_scopes(), scope)
        count = pipe.execute()[0]
        if count:
            self._spread(self._bump(self.redis))
        return count

    def replace_many(self, removes: Iterable[Window], adds: Iterable[Window]) -> None:
        """Remove and add many windows in one transaction with one version bump (``checks
        apply``). Unlike :meth:`add`, a check scope is not looked up: the caller wrote the
        check first."""
        removes, adds = list(removes), list(adds)
        if not (removes or adds):
            return
        pipe = self.redis.pipeline(transaction=True)
        for window in removes:
            pipe.hdel(self.keys.maintenance(window.scope), window.id)
        for window in adds:
            pipe.hset(self.keys.maintenance(window.scope), window.id, window.to_json())
            pipe.sadd(self.keys.maintenance_scopes(), window.scope)
        emptied = sorted({w.scope for w in removes} - {w.scope for w in adds})
        for scope in emptied:
            pipe.exists(self.keys.maintenance(scope))
        version = self._bump(pipe)
        replies = pipe.execute()
        self._spread(version)
        left = replies[len(replies) - 1 - len(emptied) : -1]
        gone = [scope for scope, exists in zip(emptied, left, strict=True) if not exists]
        if gone:
            self.redis.srem(self.keys.maintenance_scopes(), *gone)

    def list(self, scope: str | None = None) -> list[Window]:
        scopes = [scope] if scope else self.scopes()
        pipe = self.redis.pipeline(transaction=False)
        for s in scopes:
            pipe.hgetall(self.keys.maintenance(s))
        return [
            w for s, h in zip(scopes, pipe.execute(), strict=True) for w in decode_windows(s, h)
        ]

    def for_check(self, uid: str, tenant: str) -> builtins.list[Window]:  # not the method
        """The check's own windows and its tenant's, in one round trip."""
        return windows_for_check(self.redis, self.keys, uid, tenant)


def windows_for_check(client: Any, keys: Keys, uid: str, tenant: str) -> list[Window]:
    """The check's own windows and its tenant's, in one round trip."""
    check_scope = maintenance_scope(uid=uid)
    tenant_scope = maintenance_scope(tenant=tenant) if tenant else None
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.maintenance(check_scope))
    if tenant_scope:
        pipe.hgetall(keys.maintenance(tenant_scope))
    replies = pipe.execute()
    windows = decode_windows(check_scope, replies[0])
    if tenant_scope:
        windows += decode_windows(tenant_scope, replies[1])
    return windows


#: Most (prefix, uid, tenant) entries a process caches before it starts over.
MAX_CACHED = 100_000


class WindowCache:
    """The windows of the checks this process completes, valid while the maintenance version
    (``Keys.maintenance_version``) it read them under is unchanged: the post-exec write reads
    the version with the job (no extra round trip) and the windows only when it moved."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str, str], tuple[str, list[Window]]] = {}

    def windows(
        self, client: Any, keys: Keys, uid: str, tenant: str, version: str | None
    ) -> list[Window]:
        if version is None:
            return []  # no window was ever written
        key = (keys.prefix, uid, tenant)
        cached = self._entries.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        windows = windows_for_check(client, keys, uid, tenant)
        if len(self._entries) >= MAX_CACHED:
            self._entries.clear()
        self._entries[key] = (version, windows)
        return windows


#: The process's cache (workers complete runs from many threads; a dict write is atomic).
WINDOWS = WindowCache()
