"""A check definition: its fields, their validation, and its hash encoding.

Why separate from the store: validation is pure and runs before anything is written (the CLI,
``checks apply`` and the store all call it), and the encoding is the one place a definition
becomes the check hash (``Keys.check(uid)``, fields :class:`~celery_app.redis.schema.CheckField`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_app.checks.kinds import validate_check_config
from celery_app.errors import CheckFieldError
from celery_app.redis.schema import CheckField, job_id
from celery_app.settings import Settings
from scheduling_core import next_aligned, region_spread

_FORBIDDEN = set("@:")
_MAX_NAME = 200


@dataclass(frozen=True)
class CheckDefinition:
    """One recurring check. Build it with :func:`validate_definition` to get a valid one."""

    uid: str
    tenant: str
    kind: str
    target: str
    period: int
    regions: tuple[str, ...]
    region_spread: float | None = None
    plan_weight: int = 0
    config: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "tenant": self.tenant,
            "kind": self.kind,
            "target": self.target,
            "period": self.period,
            "regions": list(self.regions),
            "region_spread": self.region_spread,
            "plan_weight": self.plan_weight,
            "config": dict(self.config),
            "enabled": self.enabled,
        }

    def job_ids(self) -> list[str]:
        return [job_id(self.uid, region) for region in self.regions]

    def spread_for(self) -> timedelta:
        override = None if self.region_spread is None else timedelta(seconds=self.region_spread)
        return region_spread(timedelta(seconds=self.period), len(self.regions), override)

    def next_tick(self, region: str, now: datetime) -> datetime:
        period = timedelta(seconds=self.period)
        return next_aligned(now, period, period, self.uid, region, self.regions, self.spread_for())


@dataclass(frozen=True)
class StoredCheck:
    definition: CheckDefinition
    version: int


# --- validation (pure) -----------------------------------------------------------------------


def _name(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise CheckFieldError(field_name, "must be a non-empty string")
    bad = sorted({c for c in value if c in _FORBIDDEN or c.isspace()})
    if bad:
        raise CheckFieldError(
            field_name,
            f"{value!r} contains {''.join(bad)!r}; '@', ':' and whitespace are not allowed",
        )
    if len(value) > _MAX_NAME:
        raise CheckFieldError(field_name, f"is longer than {_MAX_NAME} characters")
    return value


def _int(field_name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool):
        raise CheckFieldError(field_name, f"must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise CheckFieldError(
                field_name, f"must be an integer >= {minimum}, got {value!r}"
            ) from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value < minimum:
        raise CheckFieldError(field_name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def validate_definition(settings: Settings, **raw: Any) -> CheckDefinition:
    """A valid, normalized CheckDefinition from raw fields, or CheckFieldError naming the field.

    Fields: uid, tenant, kind, target, period (whole seconds >= 1), regions (default: the
    default region; each among CHECKBEAT_REGIONS), region_spread (0 <= s < period, optional),
    plan_weight (int >= 0), config (JSON object, validated by the kind), enabled.
    """
    unknown = set(raw) - set(CheckDefinition.__dataclass_fields__)
    if unknown:
        raise CheckFieldError(sorted(unknown)[0], "unknown field")
    uid = _name("uid", raw.get("uid"))
    tenant = _name("tenant", raw.get("tenant"))
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CheckFieldError("kind", "must be a non-empty string")
    target = raw.get("target")
    if not isinstance(target, str) or not target.strip():
        raise CheckFieldError("target", "must be a non-empty string")
    period = _int("period", raw.get("period"), minimum=1)

    regions_raw = raw.get("regions")
    if regions_raw is None or regions_raw == "" or regions_raw == ():
        regions: tuple[str, ...] = (settings.default_region,)
    else:
        if isinstance(regions_raw, str):
            regions_raw = [r.strip() for r in regions_raw.split(",") if r.strip()]
        regions = tuple(regions_raw)
        if not regions:
            raise CheckFieldError("regions", "must name at least one region")
        for region in regions:
            if region not in settings.regions:
                raise CheckFieldError(
                    "regions",
                    f"unknown region {region!r} (allowed: {', '.join(settings.regions)})",
                )
        if len(set(regions)) != len(regions):
            raise CheckFieldError("regions", f"regions must be distinct, got {list(regions)}")

    spread_raw = raw.get("region_spread")
    spread: float | None = None
    if spread_raw is not None and spread_raw != "":
        try:
            spread = float(spread_raw)
        except (TypeError, ValueError):
            raise CheckFieldError(
                "region_spread", f"must be a number of seconds, got {spread_raw!r}"
            ) from None
        if not math.isfinite(spread) or not 0 <= spread < period:
            raise CheckFieldError(
                "region_spread",
                f"must satisfy 0 <= region_spread < period ({period}), got {spread}",
            )

    plan_weight = _int("plan_weight", raw.get("plan_weight", 0) or 0, minimum=0)
    config = raw.get("config") or {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise CheckFieldError("config", f"is not valid JSON: {exc}") from None
    config = validate_check_config(kind, target, config)
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise CheckFieldError("config", f"must be JSON-serializable: {exc}") from None
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise CheckFieldError("enabled", f"must be true or false, got {enabled!r}")
    return CheckDefinition(
        uid=uid,
        tenant=tenant,
        kind=kind,
        target=target,
        period=period,
        regions=regions,
        region_spread=spread,
        plan_weight=plan_weight,
        config=config,
        enabled=enabled,
    )


# --- encoding ---------------------------------------------------------------------------------


def encode_check(defn: CheckDefinition) -> dict[str, str]:
    """The check hash (``Keys.check(uid)``); the fields are :class:`CheckField`."""
    fields: dict[str, str] = {
        CheckField.TENANT: defn.tenant,
        CheckField.KIND: defn.kind,
        CheckField.TARGET: defn.target,
        CheckField.CONFIG: json.dumps(dict(defn.config), separators=(",", ":"), sort_keys=True),
        CheckField.PERIOD: str(defn.period),
        CheckField.REGIONS: ",".join(defn.regions),
        CheckField.PLAN_WEIGHT: str(defn.plan_weight),
        CheckField.ENABLED: "1" if defn.enabled else "0",
    }
    if defn.region_spread is not None:
        fields[CheckField.REGION_SPREAD] = repr(defn.region_spread)
    return fields


def decode_check(uid: str, h: Mapping[str, str]) -> StoredCheck:
    """Inverse of :func:`encode_check`, with the hash's version."""
    spread = h.get(CheckField.REGION_SPREAD)
    defn = CheckDefinition(
        uid=uid,
        tenant=h[CheckField.TENANT],
        kind=h[CheckField.KIND],
        target=h[CheckField.TARGET],
        period=int(h[CheckField.PERIOD]),
        regions=tuple(x for x in h[CheckField.REGIONS].split(",") if x),
        region_spread=float(spread) if spread not in (None, "") else None,
        plan_weight=int(h.get(CheckField.PLAN_WEIGHT) or 0),
        config=json.loads(h.get(CheckField.CONFIG) or "{}"),
        enabled=h.get(CheckField.ENABLED, "1") == "1",
    )
    return StoredCheck(defn, int(h.get(CheckField.VERSION) or 0))
