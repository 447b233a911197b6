"""A check definition: its fields, their validation, and its hash encoding.

Why separate from the store: validation is pure and runs before anything is written (the CLI,
``checks apply`` and the store all call it), and the encoding is the one place a definition
becomes the check hash (``Keys.check(uid)``, fields :class:`~celery_app.redis.schema.CheckField`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_app.checks.heartbeat_kind import HEARTBEAT_KIND
from celery_app.checks.kinds import validate_check_config
from celery_app.errors import CheckFieldError
from celery_app.input_limits import InputLimitError, check_value, loads_json
from celery_app.names import ID_RULE, TENANT_RULE, is_id, is_tenant, refused_characters
from celery_app.redis.schema import CheckField, job_id
from celery_app.registry import SHARED, Registry
from celery_app.settings import Settings
from scheduling_core import first_aligned, next_aligned, region_spread
from scheduling_core.health import MAX_THRESHOLD, MIN_THRESHOLD
from scheduling_core.heartbeat import HeartbeatSchedule, heartbeat_schedule

#: Bounds of the numbers a definition holds (inclusive). A period of at most 31 days keeps every
#: Unix-second and timedelta computation of the phase far from overflow; the weight bound keeps
#: per-weight tier credit finite.
MIN_PERIOD_S = 1
MAX_PERIOD_S = 31 * 24 * 3600
MAX_PLAN_WEIGHT = 1_000_000
MAX_TARGET = 2048
#: The most a check's config may weigh as stored (compact JSON, UTF-8): every run reads and
#: decodes it, and a kind's own field bounds (the http kind's headers, body rules) fit well
#: inside.
MAX_CONFIG_BYTES = 64 * 1024


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
    #: None: the settings default (CHECKBEAT_FAILURE_THRESHOLD / _SUCCESS_THRESHOLD / a majority)
    failure_threshold: int | None = None
    success_threshold: int | None = None
    quorum: int | None = None

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
            "failure_threshold": self.failure_threshold,
            "success_threshold": self.success_threshold,
            "quorum": self.quorum,
        }

    def job_ids(self) -> list[str]:
        return [job_id(self.uid, region) for region in self.regions]

    def spread_for(self) -> timedelta:
        override = None if self.region_spread is None else timedelta(seconds=self.region_spread)
        return region_spread(timedelta(seconds=self.period), len(self.regions), override)

    def heartbeat(self) -> HeartbeatSchedule | None:
        """The ping schedule of a heartbeat check; None for a probed kind."""
        if self.kind != HEARTBEAT_KIND:
            return None
        return heartbeat_schedule(self.period, dict(self.config))

    def next_tick(self, region: str, now: datetime) -> datetime:
        """The job's next tick after ``now``; a heartbeat check's is the deadline of a ping
        expected after ``now`` (its job waits there: a ping moves it on)."""
        if (pings := self.heartbeat()) is not None:
            return pings.deadline_after_success(now)
        period = timedelta(seconds=self.period)
        return next_aligned(now, period, period, self.uid, region, self.regions, self.spread_for())

    def first_tick(self, region: str, now: datetime) -> datetime:
        """A new job's first tick: ``now`` itself when it is in the phase's second (a new job
        has not just fired), else :meth:`next_tick` (``scheduling_core.first_aligned``)."""
        if self.kind == HEARTBEAT_KIND:
            return self.next_tick(region, now)
        period = timedelta(seconds=self.period)
        spread = self.spread_for()
        return first_aligned(now, period, period, self.uid, region, self.regions, spread)


@dataclass(frozen=True)
class StoredCheck:
    definition: CheckDefinition
    version: int


# --- validation (pure) -----------------------------------------------------------------------


def _id(field_name: str, value: Any, valid: Callable[[Any], bool], rule: str) -> str:
    if not isinstance(value, str) or not value:
        raise CheckFieldError(field_name, f"must be a non-empty string ({rule})")
    if not valid(value):
        raise CheckFieldError(field_name, f"{value!r} is not allowed: use {rule}")
    return value


def _text(field_name: str, value: Any, max_length: int) -> str:
    """Free text (a target): any Unicode but control and format characters, bounded."""
    if not isinstance(value, str) or not value.strip():
        raise CheckFieldError(field_name, "must be a non-empty string")
    bad = refused_characters(value)
    if bad:
        raise CheckFieldError(
            field_name,
            f"contains {', '.join(bad)}: control and format characters are not allowed",
        )
    if len(value) > max_length:
        raise CheckFieldError(
            field_name, f"is {len(value)} characters long; at most {max_length} are allowed"
        )
    return value


def _shown(value: Any) -> str:
    """``repr(value)``, but a huge integer by its size (its repr alone could be 4,000 digits)."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


def _int(field_name: str, value: Any, *, minimum: int, maximum: int, unit: str = "") -> int:
    allowed = f"must be an integer >= {minimum:,} and <= {maximum:,}{unit}"
    if isinstance(value, bool):
        raise CheckFieldError(field_name, f"{allowed}, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise CheckFieldError(field_name, f"{allowed}, got {value!r}") from None
    if isinstance(value, float) and value.is_integer():  # inf and nan are not
        value = int(value)
    if not isinstance(value, int) or not minimum <= value <= maximum:
        raise CheckFieldError(field_name, f"{allowed}, got {_shown(value)}")
    return value


def validate_definition(
    settings: Settings, *, registry: Registry = SHARED, **raw: Any
) -> CheckDefinition:
    """A valid, normalized CheckDefinition from raw fields, or CheckFieldError naming the field.

    The kind is looked up in ``registry`` (an app's, or the shared kinds every app knows) and
    its config validated under ``settings``.

    Fields: uid (:data:`~celery_app.names.ID_RULE`), tenant (the one tenant rule, as for cron
    tasks), kind, target (no control or format characters, at most MAX_TARGET characters),
    period (whole seconds, 1 s to 31 days), regions (default: the default region; each among
    CHECKBEAT_REGIONS), region_spread (0 <= s < period, optional), plan_weight (integer 0 to
    1,000,000), config (JSON object, validated by the kind), enabled, failure_threshold and
    success_threshold (optional integers 1 to 100), quorum (optional, 1 to the number of regions).
    """
    unknown = set(raw) - set(CheckDefinition.__dataclass_fields__)
    if unknown:
        raise CheckFieldError(sorted(unknown)[0], "unknown field")
    uid = _id("uid", raw.get("uid"), is_id, ID_RULE)
    tenant = _id("tenant", raw.get("tenant"), is_tenant, TENANT_RULE)
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CheckFieldError("kind", "must be a non-empty string")
    target = _text("target", raw.get("target"), MAX_TARGET)
    period = _int(
        "period",
        raw.get("period"),
        minimum=MIN_PERIOD_S,
        maximum=MAX_PERIOD_S,
        unit=" seconds (31 days)",
    )

    regions_raw = raw.get("regions")
    if regions_raw is None or regions_raw == "" or regions_raw == ():
        regions: tuple[str, ...] = (settings.default_region,)
    else:
        if isinstance(regions_raw, str):
            regions_raw = [r.strip() for r in regions_raw.split(",") if r.strip()]
        if not isinstance(regions_raw, list | tuple):
            raise CheckFieldError("regions", f"must be a list of regions, got {regions_raw!r}")
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
        except (TypeError, ValueError, OverflowError):
            raise CheckFieldError(
                "region_spread", f"must be a number of seconds, got {spread_raw!r}"
            ) from None
        if not math.isfinite(spread) or not 0 <= spread < period:
            raise CheckFieldError(
                "region_spread",
                f"must satisfy 0 <= region_spread < period ({period}), got {spread}",
            )

    plan_weight = _int(
        "plan_weight", raw.get("plan_weight", 0) or 0, minimum=0, maximum=MAX_PLAN_WEIGHT
    )
    config = _config(raw.get("config") or {})
    config = validate_check_config(registry, kind, target, config, settings)
    try:
        size = len(json.dumps(config, allow_nan=False, separators=(",", ":")))  # as stored
    except (TypeError, ValueError) as exc:  # NaN and infinities are not JSON either
        raise CheckFieldError("config", f"must be JSON-serializable: {exc}") from None
    if size > MAX_CONFIG_BYTES:
        raise CheckFieldError(
            "config", f"is {size:,} bytes as JSON; at most {MAX_CONFIG_BYTES:,} are allowed"
        )
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise CheckFieldError("enabled", f"must be true or false, got {enabled!r}")
    thresholds = {
        name: _optional_int(name, raw.get(name), minimum=MIN_THRESHOLD, maximum=MAX_THRESHOLD)
        for name in ("failure_threshold", "success_threshold")
    }
    quorum = _optional_int("quorum", raw.get("quorum"), minimum=1, maximum=len(regions))
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
        quorum=quorum,
        **thresholds,
    )


def _config(config: Any) -> Any:
    """The raw config (JSON text or a value) within the bounds of every JSON input (nesting,
    integer size, finite numbers: :mod:`celery_app.input_limits`), before the kind's validator
    walks it."""
    try:
        if isinstance(config, str):
            try:
                return loads_json(config, "config")
            except json.JSONDecodeError as exc:
                raise CheckFieldError("config", f"is not valid JSON: {exc}") from None
        check_value(config, "config")
    except InputLimitError as exc:
        raise CheckFieldError(exc.field, exc.problem) from None
    return config


def _optional_int(field_name: str, value: Any, *, minimum: int, maximum: int) -> int | None:
    """None / "" (the default) or an integer in range; the error names the field."""
    if value is None or value == "":
        return None
    return _int(field_name, value, minimum=minimum, maximum=maximum)


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
    fields.update(health_fields(defn, CheckField))
    return fields


def probe_digest(kind: str, target: str, config: str) -> str:
    """A digest of what a run probes, as the check hash stores it (``encode_check``'s kind,
    target and config): copied into each job (``JobField.PROBE_DIGEST``) so a worker that keeps
    a check's fields knows from the job it reads anyway whether they are still the stored ones.
    A digest of the content, not the check's version: a check deleted and created again starts
    its version over."""
    text = "\0".join((kind, target, config)).encode()
    return hashlib.blake2b(text, digest_size=12).hexdigest()


def health_fields(defn: CheckDefinition, table: Any) -> dict[str, str]:
    """The thresholds and quorum as hash fields of ``table`` (CheckField or JobField, which
    share the names); "" is the default, so clearing one overwrites the old value."""
    return {
        table.FAILURE_THRESHOLD: _text_of(defn.failure_threshold),
        table.SUCCESS_THRESHOLD: _text_of(defn.success_threshold),
        table.QUORUM: _text_of(defn.quorum),
    }


def _text_of(value: int | None) -> str:
    return "" if value is None else str(value)


def _int_of(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def decode_config(raw: str | None) -> dict[str, Any]:
    """The ``CheckField.CONFIG`` value as :func:`encode_check` wrote it (absent: ``{}``); a
    ValueError when it is not a JSON object (a hash written by something else)."""
    config = json.loads(raw or "{}")
    if not isinstance(config, dict):
        # Named by its JSON type, not quoted: a config holds the check's secrets.
        kind = type(config).__name__
        raise ValueError(f"the check's config is not a JSON object (a JSON {kind})")
    return config


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
        config=decode_config(h.get(CheckField.CONFIG)),
        enabled=h.get(CheckField.ENABLED, "1") == "1",
        failure_threshold=_int_of(h.get(CheckField.FAILURE_THRESHOLD)),
        success_threshold=_int_of(h.get(CheckField.SUCCESS_THRESHOLD)),
        quorum=_int_of(h.get(CheckField.QUORUM)),
    )
    return StoredCheck(defn, int(h.get(CheckField.VERSION) or 0))
