"""Every knob of checkbeat, read from ``CHECKBEAT_*`` environment variables and, for a Celery app
of the user's own, from its ``app.conf.checkbeat_*`` keys, and validated once.

Why one class: beat, the workers and the CLI must agree on Redis, regions and the scheduling
knobs; reading them in one place, failing loudly on a bad value and naming the variable, is what
keeps a typo in a deployment from turning into a scheduler that silently does something else.

Precedence, highest first: explicit overrides (code), the environment, the app's conf, defaults.
An error names a value as its source spells it (``CHECKBEAT_POOL_SIZE=0`` or
``app.conf.checkbeat_pool_size=0``), and an unknown ``checkbeat_*`` key in a conf is an error
listing close matches: a typo there must not be ignored. (Unknown ``CHECKBEAT_*`` variables are
ignored: an environment is shared with compose files and other tools.)

Durations accept seconds (``"1.5"``) or ISO 8601 (``"PT1.5S"``). Lists accept commas
(``"eu,us"``) or JSON (``'["eu","us"]'``). Every number is bounded (:data:`BOUNDS`): NaN,
infinities and absurd magnitudes are refused with the variable's name and its allowed range,
because a NaN compares false with every minimum and an infinite lease is never reaped.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import (
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from celery_app.cluster_url import ClusterUrlError, is_cluster_url, parse_cluster_url

ENV_PREFIX = "CHECKBEAT_"
#: The namespace of checkbeat's keys in a Celery app's configuration (``app.conf.checkbeat_x``).
CONF_PREFIX = "checkbeat_"
#: The conf key where an app keeps its validated Settings; not a setting itself.
SETTINGS_CONF_KEY = "checkbeat_settings"

CommaList = Annotated[list[str], NoDecode]


def _split_list(value: Any) -> Any:
    """Accept ``a,b`` or a JSON list, so shell users and compose files both read naturally."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def listen_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6, ``:port`` for every address) as (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(
            f"must be host:port with a port from 0 to 65535 (0: any free port), got {text!r}"
        )
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if any(c.isspace() or c in "/[]" for c in host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    return host, int(port)


def redact_url(url: str) -> str:
    """``url`` with its password (and a user-only secret) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    creds, _, host = rest.partition("@")
    user, colon, _password = creds.partition(":")
    masked = f"{user}:***" if colon else "***"
    return f"{scheme}://{masked}@{host}"


@dataclass(frozen=True)
class Bound:
    """The allowed range of one numeric setting (``low`` exclusive when ``low_open``)."""

    low: float
    high: float
    unit: str = ""
    low_open: bool = False
    note: str = ""

    def allows(self, value: float) -> bool:
        """In range (NaN compares false with both ends; a huge int is compared, not floated)."""
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def text(self) -> str:
        def number(x: float) -> str:
            return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

        low = f"{'>' if self.low_open else '>='} {number(self.low)}{self.unit}"
        note = f" ({self.note})" if self.note else ""
        return f"{low} and <= {number(self.high)}{self.unit}{note}"


_DAY_S = 86_400
_DAY_MS = _DAY_S * 1000

#: The range of every numeric setting. Durations are in seconds whatever their spelling.
BOUNDS: dict[str, Bound] = {
    "pool_size": Bound(1, 10_000),
    "fast_lane_reserved": Bound(0, 9_999),
    "results_history": Bound(1, 100_000),
    "slow_threshold_ms": Bound(0, _DAY_MS, " ms", note="1 day"),
    "cost_timeout_factor": Bound(0, 1_000),
    "lane_slow_threshold_ms": Bound(0, _DAY_MS, " ms", note="1 day"),
    "lane_fast_threshold_ms": Bound(0, _DAY_MS, " ms", note="1 day"),
    "dispatch_interval": Bound(0, 60, " s", low_open=True),
    "dispatch_lead": Bound(0, 5, " s"),
    "cron_lead": Bound(0, 0.5, " s"),
    "lease_margin": Bound(0, 3_600, " s", note="1 hour"),
    "tier_credit_per_weight": Bound(0, 3_600, " s", note="1 hour"),
    "tier_credit_max": Bound(0, _DAY_S, " s", note="1 day"),
    "check_timeout": Bound(0, _DAY_S, " s", note="1 day"),
    "cost_timeout_floor": Bound(0, _DAY_S, " s", note="1 day"),
    "cron_grace": Bound(0, _DAY_S, " s", low_open=True, note="1 day"),
    "beat_heartbeat_stale": Bound(0, _DAY_S, " s", low_open=True, note="1 day"),
    "metrics_checks_page_size": Bound(1, 100_000),
    "failure_threshold": Bound(1, 100),
    "success_threshold": Bound(1, 100),
    "transitions_history": Bound(1, 100_000),
    "tenant_transitions_history": Bound(1, 1_000_000),
    "transition_timeout": Bound(0, 3_600, " s", low_open=True, note="1 hour"),
    "transition_retries": Bound(0, 1_000),
    "redis_wait_replicas": Bound(-1, 16, note="-1 = 1 under Sentinel, else 0"),
    "redis_wait_timeout": Bound(0, 10, " s", low_open=True),
}

#: Settings read as durations: seconds (``10``, ``1.5``) or ISO 8601 (``PT10S``).
_TIMEDELTAS = (
    "tier_credit_per_weight",
    "tier_credit_max",
    "check_timeout",
    "cost_timeout_floor",
    "cron_grace",
    "beat_heartbeat_stale",
)
#: Durations kept as float seconds, the type their callers (dispatcher, beat) compute with.
_FLOAT_SECONDS = (
    "dispatch_interval",
    "dispatch_lead",
    "cron_lead",
    "lease_margin",
    "transition_timeout",
    "redis_wait_timeout",
)
_DURATION_FORMS = "seconds such as 10 or 1.5, or ISO 8601 such as PT10S"
_ISO_DURATION = TypeAdapter(timedelta)

_KEY_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}")
#: Settings whose values are secrets: an error names them, never shows them.
SECRET_FIELDS = ("metrics_basic_auth", "metrics_bearer_token")
#: "This network" (RFC 791): a connect to 0.0.0.0 reaches the local host.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_REGION = re.compile(r"(?=.*[A-Za-z0-9])[A-Za-z0-9_\-]{1,64}")


def _described(text: str, name: str) -> str:
    """A field's description with its allowed range, so the configuration table states it too."""
    return f"{text} Allowed: {BOUNDS[name].text()}."


def _duration(value: Any) -> timedelta:
    """A duration setting as a timedelta; ValueError (never OverflowError) when unreadable."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"must be a duration ({_DURATION_FORMS}), got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                return _ISO_DURATION.validate_python(text)
            except (ValidationError, OverflowError):
                raise ValueError(f"must be a duration ({_DURATION_FORMS})") from None
    elif isinstance(value, int | float):
        seconds = float(value) if abs(value) < 1e300 else math.inf
    else:
        raise ValueError(f"must be a duration ({_DURATION_FORMS}), got {value!r}")
    if not math.isfinite(seconds) or abs(seconds) > 1e12:  # beyond what timedelta can hold
        return timedelta.max if not seconds < 0 else timedelta.min  # NaN too: refused by bounds
    return timedelta(seconds=seconds)


class SettingsError(ValueError):
    """A configuration value is invalid; the message names the variable and what is allowed."""


@dataclass(frozen=True)
class ConfEntry:
    """One key of a Celery app's configuration: as written, within checkbeat's namespace."""

    written: str  # how an error names it, e.g. "app.conf.checkbeat_pool_size"
    key: str  # the key without Celery's own namespace, e.g. "checkbeat_pool_size"
    value: Any


@dataclass(frozen=True)
class ConfValues:
    """Settings given by an app's configuration, each with the name an error gives it.

    ``values`` may also hold defaults the app implies (its redis:// broker as ``redis_url``),
    named after the key they came from (``app.conf.broker_url``).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)


def conf_values(entries: Iterable[ConfEntry]) -> ConfValues:
    """The ``checkbeat_*`` entries as settings; SettingsError naming every unknown key (with its
    close matches) or a setting given twice. Other keys are Celery's and are left alone."""
    known = tuple(Settings.model_fields)
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    problems: list[str] = []
    for entry in entries:
        key = entry.key.lower()
        if not key.startswith(CONF_PREFIX) or key == SETTINGS_CONF_KEY:
            continue
        name = key.removeprefix(CONF_PREFIX)
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = (
                "did you mean " + " or ".join(f"{CONF_PREFIX}{c}" for c in close) + "?"
                if close
                else "`checkbeat settings` lists every setting"
            )
            problems.append(f"{entry.written}: not a checkbeat setting; {hint}")
        elif name in names:
            problems.append(f"{entry.written}: given twice (also as {names[name]})")
        else:
            values[name], names[name] = entry.value, entry.written
    if problems:
        raise SettingsError("invalid checkbeat configuration:\n  " + "\n  ".join(problems))
    return ConfValues(values, names)


@dataclass(frozen=True)
class _Loading:
    """What :func:`load_settings` is reading now: the conf's values and each field's name."""

    conf: ConfValues
    names: Mapping[str, str]


_LOADING: ContextVar[_Loading | None] = ContextVar("checkbeat_settings_loading", default=None)


def env_name(name: str) -> str:
    """The environment variable of setting ``name`` (``pool_size`` -> ``CHECKBEAT_POOL_SIZE``)."""
    return f"{ENV_PREFIX}{name.upper()}"


def _name(name: str) -> str:
    """How the value of setting ``name`` being validated now was given, for an error message."""
    loading = _LOADING.get()
    return loading.names[name] if loading is not None else env_name(name)


class _AppConfSource(PydanticBaseSettingsSource):
    """The app's conf values as a settings source, ranked below the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        loading = _LOADING.get()
        return dict(loading.conf.values) if loading is not None else {}


class Settings(BaseSettings):
    """checkbeat's configuration. Field ``x`` is read from ``CHECKBEAT_X``, else (own apps) from
    ``app.conf.checkbeat_x``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Overrides, then the environment, then the app's conf (see :func:`load_settings`)."""
        return (
            init_settings,
            env_settings,
            _AppConfSource(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    # --- connections -------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description=(
            "Redis holding checkbeat's state (checks, jobs, cron state, leases): redis://, "
            "rediss://, sentinel://... or a Redis Cluster, redis+cluster://h:p[,h:p...] "
            "(docs/high-availability.md). In your own app it defaults to the app's broker_url "
            "when that is a redis:// or rediss:// URL."
        ),
    )
    broker_url: str | None = Field(
        None,
        description=(
            "Celery broker URL of the ready-made app (celery -A celery_app); defaults to "
            "CHECKBEAT_REDIS_URL (required when that is a Redis Cluster: kombu has no Cluster "
            "transport). Your own app keeps its own broker_url."
        ),
    )
    redis_tls_cert_reqs: str = Field(
        "required",
        description=(
            "Certificate verification for rediss:// URLs (state and broker): 'required' "
            "(default), 'optional' or 'none'. kombu alone would fall back to 'none' for a "
            "rediss:// broker without options; checkbeat never does unless told here."
        ),
    )
    redis_tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) that signs the Redis server certificate (rediss:// only).",
    )
    redis_tls_certfile: str | None = Field(
        None, description="Client certificate (PEM) for Redis servers that require mutual TLS."
    )
    redis_tls_keyfile: str | None = Field(
        None, description="Private key (PEM) of CHECKBEAT_REDIS_TLS_CERTFILE."
    )
    redis_sentinel_master: str = Field(
        "mymaster",
        description=(
            "Master name the Sentinels monitor, for sentinel://h:p;sentinel://h:p[/db] URLs "
            "(state and broker)."
        ),
    )
    redis_sentinel_password: str | None = Field(
        None,
        description=(
            "Password of the Sentinels themselves (their requirepass); the data nodes' password "
            "goes in the URL (sentinel://:pw@h:p;...)."
        ),
    )
    redis_sentinel_tls: bool = Field(
        False,
        description=(
            "Talk TLS to the Sentinels and the data nodes of a sentinel:// URL, verified per "
            "CHECKBEAT_REDIS_TLS_*."
        ),
    )
    redis_wait_replicas: int = Field(
        -1,
        description=_described(
            "Replicas that must acknowledge a cron window key, a cron run key or a check "
            "completion before checkbeat acts on it (Redis WAIT); see "
            "docs/high-availability.md.",
            "redis_wait_replicas",
        ),
    )
    redis_wait_timeout: float = Field(
        0.25,
        description=_described(
            "How long one WAIT for replicas may block; on a shortfall checkbeat logs and goes on.",
            "redis_wait_timeout",
        ),
    )
    key_prefix: str = Field(
        "checkbeat",
        description=(
            "Prefix of every Redis key checkbeat writes: 1-100 letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or digit."
        ),
    )
    timezone: str = Field(
        "UTC",
        description=(
            "Default timezone of cron tasks (IANA name). In your own app it defaults to the "
            "app's timezone setting."
        ),
    )
    imports: CommaList = Field(
        default_factory=list,
        description="User modules to import at start-up (cron tasks, check kinds, providers).",
    )

    # --- cron tasks ----------------------------------------------------------------------
    cron_grace: timedelta = Field(
        timedelta(seconds=60),
        description=_described(
            "How long after a cron window ends its messages may still be sent and run: a beat "
            "that was briefly stalled fires a missed window within it, a message expires at it.",
            "cron_grace",
        ),
    )
    cron_lead: float = Field(
        0.05,
        description=_described(
            "How far ahead of a cron window's start beat fires it; the worker waits until the "
            "start (Redis time) before the run key and the body, so the body starts on time, "
            "never before. Applies when workers run checkbeat's recording (install(app), "
            "celery_app.cron_tasks.recording in imports, or every task @cron). 0 = fire at "
            "the start.",
            "cron_lead",
        ),
    )
    tenants_provider: str = Field(
        "auto",
        description=(
            "Where per-tenant cron tasks get their tenants: 'auto' (the @tenants_provider "
            "function if one is registered, else the Redis set managed by `celery tenants`), "
            "'redis' (that set), 'none' (per-tenant tasks do not fire; diagnose reports it) or "
            "a dotted path 'package.module:function' returning an iterable of tenant names."
        ),
    )
    beat_heartbeat_stale: timedelta = Field(
        timedelta(seconds=120),
        description=_described(
            "A beat whose last heartbeat is older than this counts as not running.",
            "beat_heartbeat_stale",
        ),
    )

    # --- topology ----------------------------------------------------------------------
    regions: CommaList = Field(
        default_factory=lambda: ["local"],
        description=(
            "Regions checks run in (letters, digits, '-' and '_'); the first is the default "
            "region of a new check."
        ),
    )
    pool_size: int = Field(
        8, description=_described("Probe slots per region (fast + shared worker).", "pool_size")
    )
    fast_lane_reserved: int = Field(
        2,
        description=_described(
            "Slots of pool_size only fast checks may use (fewer than pool_size).",
            "fast_lane_reserved",
        ),
    )

    # --- scheduling knobs (scheduling_core.Params; 0 = off) -------------------------------
    slow_threshold_ms: float = Field(
        0.0,
        description=_described(
            "Dead band: weighted cost below this many ms adds no offset.", "slow_threshold_ms"
        ),
    )
    tier_credit_per_weight: timedelta = Field(
        timedelta(0),
        description=_described(
            "Deadline credit per unit of plan weight.", "tier_credit_per_weight"
        ),
    )
    tier_credit_max: timedelta = Field(
        timedelta(0),
        description=_described("Cap on the total tier credit; 0 = no cap.", "tier_credit_max"),
    )
    check_timeout: timedelta = Field(
        timedelta(0),
        description=_described("Execution ceiling per check; 0 means 15 s.", "check_timeout"),
    )
    cost_timeout_factor: float = Field(
        0.0,
        description=_described(
            "Timeout = factor x cost EWMA (clamped); 0 = flat ceiling.", "cost_timeout_factor"
        ),
    )
    cost_timeout_floor: timedelta = Field(
        timedelta(0),
        description=_described("Lowest cost-aware timeout.", "cost_timeout_floor"),
    )
    lane_slow_threshold_ms: float = Field(
        1000.0,
        description=_described(
            "Cost EWMA at which a check moves to the slow lane; 0 = no lanes.",
            "lane_slow_threshold_ms",
        ),
    )
    lane_fast_threshold_ms: float = Field(
        500.0,
        description=_described(
            "Cost EWMA below which a slow check returns to the fast lane (below the slow "
            "threshold).",
            "lane_fast_threshold_ms",
        ),
    )

    # --- check dispatch ------------------------------------------------------------------
    dispatch_interval: float = Field(
        0.5,
        description=_described(
            "Time between dispatcher ticks in beat (claim, publish, reap).", "dispatch_interval"
        ),
    )
    dispatch_lead: float = Field(
        0.02,
        description=_described(
            "How far ahead of its tick a due check is claimed; its worker waits in the slot "
            "until the tick (Redis time), so it starts on time. A slot waiting is one no due "
            "check can take: keep it near the claim-to-start time. 0 = claim only when due.",
            "dispatch_lead",
        ),
    )
    lease_margin: float = Field(
        5.0,
        description=_described(
            "How long a claim outlives the hard time limit before it is reaped as lost.",
            "lease_margin",
        ),
    )
    results_history: int = Field(
        100,
        description=_described(
            "Results kept per check in its capped results stream.", "results_history"
        ),
    )

    # --- check state and transitions -----------------------------------------------------
    failure_threshold: int = Field(
        3,
        description=_described(
            "Consecutive failures before a region of a check is down (a check may set its own).",
            "failure_threshold",
        ),
    )
    success_threshold: int = Field(
        2,
        description=_described(
            "Consecutive successes before a region of a check is up again (a check may set its "
            "own).",
            "success_threshold",
        ),
    )
    transitions_history: int = Field(
        100,
        description=_described(
            "Transitions kept per check in its capped transitions stream.", "transitions_history"
        ),
    )
    tenant_transitions_history: int = Field(
        1000,
        description=_described(
            "Transitions kept per tenant in its capped transitions stream.",
            "tenant_transitions_history",
        ),
    )
    transition_queue: str = Field(
        "celery",
        description="The Celery queue the @on_transition hooks run from (a worker consumes it).",
    )
    transition_timeout: float = Field(
        30.0,
        description=_described(
            "Time limit of one delivery of a transition to the hooks; a delivery not finished "
            "2 s after it (worker killed) is published again.",
            "transition_timeout",
        ),
    )
    transition_retries: int = Field(
        5,
        description=_described(
            "Retries of a delivery whose hook raised (exponential backoff, by the queue) before "
            "it is kept as failed.",
            "transition_retries",
        ),
    )

    # --- probes --------------------------------------------------------------------------
    allow_private_targets: bool = Field(
        False, description="Let probes reach loopback, private and link-local addresses."
    )
    allowed_target_addresses: CommaList = Field(
        default_factory=list,
        description=(
            "Single IP addresses probes may reach although they are not public; unspecified "
            "addresses (0.0.0.0/8, ::) are refused."
        ),
    )
    probe_tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) http probes trust besides the public CAs (internal CAs).",
    )

    # --- metrics -------------------------------------------------------------------------
    metrics_addr: str = Field(
        "",
        description=(
            "Where beat and each worker serve `/metrics` and `/healthz`, as `host:port` (port 0: "
            "any free port); empty turns them off. `checkbeat up` and compose.yaml set it."
        ),
    )
    metrics_basic_auth: SecretStr | None = Field(
        None,
        description=(
            "`user:password` every page of the metrics servers (`/metrics`, "
            "`/metrics/checks`, `/healthz`) requires as HTTP basic auth; unset: no basic auth. "
            "Never logged."
        ),
    )
    metrics_bearer_token: SecretStr | None = Field(
        None,
        description=(
            "A token every page of the metrics servers accepts as `Authorization: Bearer "
            "<token>` (Prometheus's `authorization`); unset: none. With neither this nor "
            "CHECKBEAT_METRICS_BASIC_AUTH the pages are open. Never logged."
        ),
    )
    metrics_checks_page_size: int = Field(
        1000,
        description=_described(
            "Checks per page of beat's per-check exporter (`/metrics/checks?page=N`); a scrape "
            "reads no more than one page.",
            "metrics_checks_page_size",
        ),
    )

    @field_validator("imports", "regions", "allowed_target_addresses", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one region, e.g. 'eu,us'")
        for region in value:
            if not _REGION.fullmatch(region):
                raise ValueError(
                    f"region {region!r} may contain only letters, digits, '-' and '_' "
                    "(1-64 ASCII characters)"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"regions must be distinct, got {value}")
        return value

    @field_validator("allowed_target_addresses")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                address = ipaddress.ip_address(text)
            except ValueError:
                raise ValueError(
                    f"{text!r} is not an IP address; list single addresses such as 10.0.0.7"
                ) from None
            mapped = getattr(address, "ipv4_mapped", None) or address
            if mapped.is_unspecified or mapped in _THIS_NETWORK:
                raise ValueError(
                    f"{text!r} is an unspecified address (0.0.0.0/8, ::): a connection to it "
                    "reaches this host; list the address of the target itself"
                )
        return value

    @field_validator("metrics_basic_auth", "metrics_bearer_token")
    @classmethod
    def _credential(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return None
        text = value.get_secret_value()
        if not text:  # an empty variable (compose's ${X:-}) is unset
            return None
        if any(not 0x20 < ord(c) < 0x7F for c in text):
            raise ValueError("must be visible ASCII, no spaces or line breaks")
        if info.field_name == "metrics_basic_auth" and not text.partition(":")[0]:
            raise ValueError("must be user:password")
        if info.field_name == "metrics_basic_auth" and ":" not in text:
            raise ValueError("must be user:password")
        return value

    @field_validator("metrics_addr")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        value = value.strip()
        if value:
            listen_address(value)
        return value

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _cluster_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A cluster URL must parse; the broker may not be one (kombu has no Cluster
        transport, celery/celery#2852): docs/high-availability.md, "Redis Cluster"."""
        if not is_cluster_url(value):
            return value
        if info.field_name == "broker_url":
            raise ValueError(
                "the broker cannot be a Redis Cluster (kombu has no Cluster transport, "
                "celery/celery#2852): use a redis:// or sentinel:// broker"
            )
        try:
            parse_cluster_url(value)  # type: ignore[arg-type]  # a str here: checked above
        except ClusterUrlError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("redis_tls_cert_reqs")
    @classmethod
    def _cert_reqs(cls, value: str) -> str:
        value = value.strip().lower()
        if value not in ("required", "optional", "none"):
            raise ValueError(f"must be 'required', 'optional' or 'none', got {value!r}")
        return value

    @field_validator(
        "redis_tls_ca_file", "redis_tls_certfile", "redis_tls_keyfile", "probe_tls_ca_file"
    )
    @classmethod
    def _readable_file(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not os.path.isfile(value) or not os.access(value, os.R_OK):
            raise ValueError(f"{value!r} is not a readable file")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            sample = ", ".join(sorted(available_timezones())[:3])
            raise ValueError(
                f"unknown timezone {value!r}; use an IANA name such as UTC, Europe/Berlin "
                f"(e.g. {sample}, ...)"
            ) from None
        return value

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        """Validated rather than escaped where used: the prefix is part of SCAN patterns
        (reconcile finds checks by ``<prefix>:check:*``), of every key and of Lua-built names,
        so glob characters (``*?[]\\``), spaces and control characters are refused once here."""
        if not _KEY_PREFIX.fullmatch(value):
            raise ValueError(
                "must be 1-100 letters, digits, '_', '.', ':' or '-', starting with a letter "
                "or digit (glob characters such as '*', '?', '[' and '\\' would break the SCAN "
                "patterns of reconcile)"
            )
        return value

    @field_validator(*_TIMEDELTAS, *_FLOAT_SECONDS, mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        """Seconds or ISO 8601, range-checked before a timedelta is built (``1e20`` seconds or
        ``inf`` would otherwise raise OverflowError, a raw traceback instead of a message)."""
        name = info.field_name
        assert name is not None
        duration = _duration(value)
        seconds = duration.total_seconds()
        if not BOUNDS[name].allows(seconds):
            raise ValueError(f"must be a duration {BOUNDS[name].text()} ({_DURATION_FORMS})")
        return seconds if name in _FLOAT_SECONDS else duration

    @field_validator("tenants_provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        value = value.strip()
        if value in ("auto", "redis", "none"):
            return value
        module, sep, attr = value.partition(":")
        if not sep:
            module, _, attr = value.rpartition(".")
        if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
            raise ValueError(
                "must be 'auto', 'redis', 'none' or a dotted path such as "
                f"'mypkg.tenants:active', got {value!r}"
            )
        return value

    @field_validator(*(name for name in BOUNDS if name not in (*_TIMEDELTAS, *_FLOAT_SECONDS)))
    @classmethod
    def _within(cls, value: float, info: ValidationInfo) -> float:
        assert info.field_name is not None
        bound = BOUNDS[info.field_name]
        if not bound.allows(value):
            kind = "an integer" if isinstance(value, int) else "a finite number"
            raise ValueError(f"must be {kind} {bound.text()}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> Settings:
        if is_cluster_url(self.redis_url) and not self.broker_url:
            raise ValueError(
                f"{_name('broker_url')} must be set when {_name('redis_url')} is a Redis Cluster: "
                "the broker stays a plain or Sentinel Redis (kombu has no Cluster transport, "
                "celery/celery#2852)"
            )
        if is_cluster_url(self.redis_url) and self.redis_wait_replicas > 0:
            raise ValueError(
                f"{_name('redis_wait_replicas')} ({self.redis_wait_replicas}) must be 0 or -1 with "
                "a Redis Cluster state store: WAIT covers one connection's writes, and a cluster "
                "client spreads them over nodes"
            )
        if self.fast_lane_reserved >= self.pool_size:
            raise ValueError(
                f"{_name('fast_lane_reserved')} ({self.fast_lane_reserved}) must be smaller than "
                f"{_name('pool_size')} ({self.pool_size}): slow checks need at least one slot"
            )
        if self.lane_slow_threshold_ms > 0 and (
            self.lane_fast_threshold_ms >= self.lane_slow_threshold_ms
        ):
            raise ValueError(
                f"{_name('lane_fast_threshold_ms')} ({self.lane_fast_threshold_ms}) must be below "
                f"{_name('lane_slow_threshold_ms')} ({self.lane_slow_threshold_ms}): the band "
                "between them stops a check from flipping lanes every run"
            )
        return self

    def __repr_args__(self) -> Any:
        """Like pydantic's, with URL passwords masked: settings end up in logs and tracebacks."""
        for name, value in super().__repr_args__():
            if name in ("redis_url", "broker_url") and isinstance(value, str):
                value = redact_url(value)
            yield name, value

    # --- derived -------------------------------------------------------------------------
    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def default_region(self) -> str:
        return self.regions[0]

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def shared_slots(self) -> int:
        """Slots of the shared worker: the only ones slow checks may take."""
        return self.pool_size - self.fast_lane_reserved


def _shown(given: Any, limit: int = 80) -> str:
    """The offending value for an error line: its repr, cut at ``limit`` characters."""
    try:
        text = repr(given)
    except ValueError:  # an int too long to print (Python refuses > 4300 digits)
        return "<an integer of more than 4300 digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _source_names(conf: ConfValues, overrides: Mapping[str, Any]) -> dict[str, str]:
    """Each field's name as given by the source that wins for it (overrides are named like the
    environment, as before)."""
    in_env = {key.lower() for key in os.environ}
    names = {}
    for name in Settings.model_fields:
        given_by_conf = name in conf.names and name not in overrides
        names[name] = (
            conf.names[name]
            if given_by_conf and env_name(name).lower() not in in_env
            else env_name(name)
        )
    return names


def load_settings(conf: ConfValues | None = None, /, **overrides: Any) -> Settings:
    """Read ``overrides``, then the environment, then ``conf`` (an app's ``checkbeat_*`` keys);
    raise SettingsError naming each bad value as its source spells it."""
    conf = conf if conf is not None else ConfValues()
    names = _source_names(conf, overrides)
    token = _LOADING.set(_Loading(conf, names))
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            bound = BOUNDS.get(field)
            if bound is not None and bound.text() not in message:
                message += f" (allowed: {bound.text()})"
            given = error.get("input")
            if field in ("redis_url", "broker_url") and isinstance(given, str):
                given = redact_url(given)
            if field in SECRET_FIELDS:
                given = "***"
            if field:
                lines.append(f"{names.get(field, env_name(field))}={_shown(given)}: {message}")
            else:
                lines.append(message)
        raise SettingsError("invalid checkbeat configuration:\n  " + "\n  ".join(lines)) from None
    finally:
        _LOADING.reset(token)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The environment's settings, read once per process: what ``create_app()`` without an
    argument (and so ``celery_app.app``) is built with.

    Nothing below the app calls this: code that has an app reads ``settings_of(app)``, code that
    has none takes the settings as an argument, so an app built with ``create_app(settings)`` is
    never judged by the environment. Tests call ``get_settings.cache_clear()``.
    """
    return load_settings()


def _default_text(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value) or "(empty)"
    return str(value) or "(empty)"


def settings_markdown() -> str:
    """The configuration table of docs/configuration.md, generated so it cannot drift from the
    code."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        default = info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]  # takes no data
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{_default_text(default)}` | {meaning} |")
    return "\n".join(rows)
