"""Maintenance windows of a check or of a tenant: while one is open, checks keep running, their
results are marked and their transitions are held back until it closes.

A window starts at every firing of a cron spec (our parser, ``scheduling_core.cron``) in a
timezone and lasts a duration. Windows are stored per scope (``Keys.maintenance(scope)``, scope
``check:<uid>`` or ``tenant:<tenant>``) as JSON, by the store notification targets share
(``checks/scoped_store.py``); the worker reads a check's and its tenant's at each completion and
tells ``complete.lua`` when the open window ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_app.checks.scoped_store import (
    ScopedKind,
    ScopedStore,
    decode_scope,
    read_for_check,
    validated_id,
    validated_scope,
)
from celery_app.errors import CheckFieldError
from celery_app.redis.kept import KeptReadings
from celery_app.redis.schema import Keys
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
    scope = validated_scope(uid, tenant)
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
    return Window(validated_id(window_id), scope, cron.strip(), int(seconds), timezone)


def open_until(windows: Iterable[Window], now: datetime) -> datetime | None:
    """The latest end of the windows open at ``now`` (None: none is open)."""
    ends = [end for w in windows if (end := w.end_if_open(now)) is not None]
    return max(ends) if ends else None


def next_start(windows: Iterable[Window], now: datetime) -> tuple[datetime, Window] | None:
    """The next window start after ``now`` among ``windows``, and its window."""
    starts = [(start, w) for w in windows if (start := w.next_start(now)) is not None]
    return min(starts, key=lambda item: item[0]) if starts else None


def decode_windows(scope: str, h: Mapping[str, str]) -> list[Window]:
    return decode_scope(Window.from_json, scope, h)


class MaintenanceStore(ScopedStore[Window]):
    """Add, remove and list windows; read the windows that apply to a check. Every write moves
    ``Keys.maintenance_version``, so workers keep the windows they read until it moves."""

    kind = ScopedKind(
        Keys.maintenance, Keys.maintenance_scopes, Window.from_json, Keys.maintenance_version
    )


def windows_for_check(client: Any, keys: Keys, uid: str, tenant: str) -> list[Window]:
    """The check's own windows and its tenant's, in one round trip."""
    return read_for_check(client, keys.maintenance, decode_windows, uid, tenant)


#: Most (prefix, uid, tenant) entries a process caches before it starts over.
MAX_CACHED = 100_000

#: How long a process plans with the maintenance version it last read before a run's start
#: read asks for it again: a window's change reaches the marks of runs that count no change of
#: state within this. A run that counts the check's state is checked against the version as
#: it is (``complete.lua``'s guard), whatever this process knows.
VERSION_REFRESH_S = 1.0


class WindowCache:
    """The windows of the checks this process completes, valid while the maintenance version
    (``Keys.maintenance_version``) it read them under is unchanged, and the newest version it
    saw in each partition: a run's write is planned with that one, read again by a start read
    at most every ``VERSION_REFRESH_S`` (``checks.start_read``), and its guard
    (``complete.lua``) sends a run that counts the check's state back to read it when it moved."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str, str], tuple[str, list[Window]]] = {}
        # Keys.maintenance_version -> its value (None: unset)
        self._versions: KeptReadings[str | None] = KeptReadings(VERSION_REFRESH_S)

    def version_due(self, keys: Keys) -> bool:
        """Whether the version of ``keys``' partition is to be read again now
        (:meth:`KeptReadings.due`)."""
        return self._versions.due(keys.maintenance_version())

    def version_read(self, keys: Keys, version: str | None, read_at: float | None = None) -> None:
        """The version of ``keys``' partition, as read at ``read_at`` (default now)."""
        self._versions.read(keys.maintenance_version(), version, read_at)

    def known_version(self, keys: Keys) -> str | None:
        """The maintenance version of ``keys``' partition as this process last read it (None:
        unset, or never read here)."""
        return self._versions.last(keys.maintenance_version())

    def windows(
        self, client: Any, keys: Keys, uid: str, tenant: str, version: str | None
    ) -> list[Window]:
        """The windows of check ``uid`` of ``tenant`` under ``version``, read now (None: no
        window was ever written)."""
        self.version_read(keys, version)
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
