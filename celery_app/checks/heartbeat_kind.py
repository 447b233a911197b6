"""The ``heartbeat`` check kind: its config, validated like every kind's, and its schedule.

A heartbeat check is not probed: the job it watches pings it (``checks/heartbeat.py``), and
beat's dispatcher fails it when a ping is late (``scheduling_core/heartbeat.py``). Its config:

- ``grace`` (seconds, 0 to 7 days, default 60): how late a ping may come before it counts
  as missed;
- ``cron`` (a 5-field cron spec) and ``timezone`` (IANA name, default UTC): a ping is expected
  after each firing; without it, one every ``period`` seconds (the check's period);
- ``max_duration`` (seconds, 1 to 31 days, optional): a run that sent its start ping and no
  success within it is a failure, although the job may still be running;
- ``expected_duration`` (seconds, 1 to 31 days and at most ``max_duration``, optional): a run
  longer than it is degraded, whether still running at start + ``expected_duration`` or
  finished (its success ping's duration);
- ``token`` (16 to 128 letters, digits, '-' or '_'): the secret an HTTP ping must carry in its
  URL; one is made when none is given, and it is masked wherever a config is shown.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_app.checks.kinds import check_kind
from celery_app.errors import CheckFieldError
from scheduling_core import CronError, parse

HEARTBEAT_KIND = "heartbeat"
MAX_GRACE_S = 7 * 86_400
MAX_DURATION_S = 31 * 86_400
DEFAULT_GRACE_S = 60
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
_KEYS = {"grace", "cron", "timezone", "max_duration", "expected_duration", "token"}


def _seconds(config: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise CheckFieldError(
            f"config.{key}",
            f"must be a number of seconds from {low:g} to {high:,.0f}, got {value!r}",
        )
    return float(value)


def validate_heartbeat(target: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized config of a heartbeat check, or CheckFieldError naming the key."""
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise CheckFieldError(
            f"config.{unknown[0]}",
            f"is not a heartbeat setting (known: {', '.join(sorted(_KEYS))})",
        )
    grace = _seconds(config, "grace", 0, MAX_GRACE_S)
    out: dict[str, Any] = {"grace": DEFAULT_GRACE_S if grace is None else grace}
    cron = config.get("cron")
    if cron is not None:
        if not isinstance(cron, str):
            raise CheckFieldError("config.cron", f"must be a cron spec string, got {cron!r}")
        try:
            parse(cron)
        except CronError as exc:
            raise CheckFieldError("config.cron", str(exc)) from None
        out["cron"] = cron
    zone = config.get("timezone")
    if zone is not None:
        if cron is None:
            raise CheckFieldError("config.timezone", "applies only with config.cron")
        try:
            ZoneInfo(str(zone))
        except (ZoneInfoNotFoundError, ValueError):
            raise CheckFieldError(
                "config.timezone", f"{zone!r} is not an IANA timezone name"
            ) from None
        out["timezone"] = str(zone)
    max_duration = _seconds(config, "max_duration", 1, MAX_DURATION_S)
    if max_duration is not None:
        out["max_duration"] = max_duration
    expected = _seconds(config, "expected_duration", 1, max_duration or MAX_DURATION_S)
    if expected is not None:
        out["expected_duration"] = expected
    token = config.get("token")
    if token is None:
        token = secrets.token_urlsafe(24)
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise CheckFieldError(
            "config.token", "must be 16 to 128 letters, digits, '-' or '_' (or leave it out)"
        )
    out["token"] = token
    return out


def _not_probed(*_args: Any, **_kwargs: Any) -> Any:
    """A heartbeat check is never sent to a worker (beat's dispatcher fails a late one)."""
    raise RuntimeError("heartbeat checks are not probed: their job pings them")


check_kind(HEARTBEAT_KIND, validate=validate_heartbeat)(_not_probed)
