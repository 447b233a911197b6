"""The model of checkbeat's settings: every field, declared once with :func:`setting` (default,
description, range, unit; a duration by its ``timedelta`` type, or ``duration=True`` for float
seconds), and the rules between them.

The field validators read what each :func:`setting` declared (:func:`declared`): a duration is
read as seconds or ISO 8601 and range-checked before it is built, any other bounded number is
range-checked, so adding a bounded setting is one declaration. Where the values come from is
:mod:`celery_app.settings.sources`; the docs table is :mod:`celery_app.settings.markdown`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from celery_app.cluster_url import ClusterUrlError, is_cluster_url, parse_cluster_url
from celery_app.names import ID_RULE, is_id
from celery_app.settings.declare import (
    DAY_MS,
    DAY_S,
    DURATION_FORMS,
    ENV_PREFIX,
    Bound,
    CommaList,
    declared,
    duration,
    env_name,
    listen_address,
    redact_url,
    setting,
    split_list,
)

_KEY_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}")
#: Settings whose values are secrets: an error names them, never shows them.
SECRET_FIELDS = ("metrics_basic_auth", "metrics_bearer_token")
#: "This network" (RFC 791): a connect to 0.0.0.0 reaches the local host.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_REGION = re.compile(r"(?=.*[A-Za-z0-9])[A-Za-z0-9_\-]{1,64}")


@dataclass(frozen=True)
class Loading:
    """What :func:`~celery_app.settings.sources.load_settings` is reading now: the app's conf
    values and the name each field's value was given under."""

    conf: Mapping[str, Any]
    names: Mapping[str, str]


LOADING: ContextVar[Loading | None] = ContextVar("checkbeat_settings_loading", default=None)


def _name(name: str) -> str:
    """How the value of setting ``name`` being validated now was given, for an error message."""
    loading = LOADING.get()
    return loading.names[name] if loading is not None else env_name(name)


class _AppConfSource(PydanticBaseSettingsSource):
    """The app's conf values as a settings source, ranked below the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        loading = LOADING.get()
        return dict(loading.conf) if loading is not None else {}


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
    redis_wait_replicas: int = setting(
        -1,
        description=(
            "Replicas that must acknowledge a cron window key, a cron run key, a check run's "
            "start or its completion before checkbeat acts on it (Redis WAIT; on a Redis "
            "Cluster, of the master that took the write); see docs/high-availability.md."
        ),
        bound=Bound(
            -1, 16, note="-1 = 1 under Sentinel, 1 per cluster master with a replica, else 0"
        ),
    )
    redis_wait_timeout: float = setting(
        0.25,
        description=(
            "How long one WAIT for replicas may block; on a shortfall checkbeat logs and goes on."
        ),
        bound=Bound(0, 10, low_open=True),
        duration=True,
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
    cron_grace: timedelta = setting(
        timedelta(seconds=60),
        description=(
            "How long after a cron window ends its messages may still be sent and run: a beat "
            "that was briefly stalled fires a missed window within it, a message expires at it."
        ),
        bound=Bound(0, DAY_S, low_open=True, note="1 day"),
    )
    cron_lead: float = setting(
        0.05,
        description=(
            "How far ahead of a cron window's start beat fires it; the worker waits until the "
            "start (Redis time) before the run key and the body, so the body starts on time, "
            "never before. Applies when workers run checkbeat's recording (install(app), "
            "celery_app.cron_tasks.recording in imports, or every task @cron). 0 = fire at "
            "the start."
        ),
        bound=Bound(0, 0.5),
        duration=True,
    )
    cron_monitor: str = Field(
        "all",
        description=(
            'Which cron tasks a heartbeat check watches (docs/heartbeats.md, "Cron tasks"): '
            "'all' (every task but intervals that are not whole seconds; a per-tenant task "
            "has one check per active tenant), 'none', or a "
            "comma-separated list of task ids. A missed window, a failed run or a run past its "
            "timeout moves the check's state (a run past its expected duration: degraded) and "
            "makes a transition, delivered once. Only in an app whose workers run checkbeat's "
            "tasks (install(app), or checkbeat's own app)."
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
    beat_heartbeat_stale: timedelta = setting(
        timedelta(seconds=120),
        description="A beat whose last heartbeat is older than this counts as not running.",
        bound=Bound(0, DAY_S, low_open=True, note="1 day"),
    )

    # --- topology ----------------------------------------------------------------------
    regions: CommaList = Field(
        default_factory=lambda: ["local"],
        description=(
            "Regions checks run in (letters, digits, '-' and '_'); the first is the default "
            "region of a new check."
        ),
    )
    check_partitions: int = setting(
        1,
        description=(
            "Partitions of the check half: each check (its jobs in every region, its state and "
            "transitions) lives in one, by a hash of its uid, and each partition is one Redis "
            "Cluster hash tag, so the check half spreads over a cluster's masters. Every worker's "
            "slots are shared out among the partitions. Change it only with `checks reconcile "
            "--partitions N` (docs/scale.md); beats and workers refuse a value the store was not "
            "built with."
        ),
        bound=Bound(1, 1024),
    )
    pool_size: int = setting(
        8,
        description="Probe slots per region (fast + shared worker).",
        bound=Bound(1, 10_000),
    )
    fast_lane_reserved: int = setting(
        2,
        description="Slots of pool_size only fast checks may use (fewer than pool_size).",
        bound=Bound(0, 9_999),
    )

    # --- scheduling knobs (scheduling_core.Params; 0 = off) -------------------------------
    slow_threshold_ms: float = setting(
        0.0,
        description="Dead band: weighted cost below this many ms adds no offset.",
        bound=Bound(0, DAY_MS, note="1 day"),
        unit="ms",
    )
    tier_credit_per_weight: timedelta = setting(
        timedelta(0),
        description="Deadline credit per unit of plan weight.",
        bound=Bound(0, 3_600, note="1 hour"),
    )
    tier_credit_max: timedelta = setting(
        timedelta(0),
        description="Cap on the total tier credit; 0 = no cap.",
        bound=Bound(0, DAY_S, note="1 day"),
    )
    check_timeout: timedelta = setting(
        timedelta(0),
        description="Execution ceiling per check; 0 means 15 s.",
        bound=Bound(0, DAY_S, note="1 day"),
    )
    cost_timeout_factor: float = setting(
        0.0,
        description="Timeout = factor x cost EWMA (clamped); 0 = flat ceiling.",
        bound=Bound(0, 1_000),
    )
    cost_timeout_floor: timedelta = setting(
        timedelta(0),
        description="Lowest cost-aware timeout.",
        bound=Bound(0, DAY_S, note="1 day"),
    )
    lane_slow_threshold_ms: float = setting(
        1000.0,
        description="Cost EWMA at which a check moves to the slow lane; 0 = no lanes.",
        bound=Bound(0, DAY_MS, note="1 day"),
        unit="ms",
    )
    lane_fast_threshold_ms: float = setting(
        500.0,
        description=(
            "Cost EWMA below which a slow check returns to the fast lane (below the slow "
            "threshold)."
        ),
        bound=Bound(0, DAY_MS, note="1 day"),
        unit="ms",
    )

    # --- check dispatch ------------------------------------------------------------------
    dispatch_interval: float = setting(
        0.5,
        description="Time between dispatcher ticks in beat (claim, publish, reap).",
        bound=Bound(0, 60, low_open=True),
        duration=True,
    )
    dispatch_lead: float = setting(
        0.1,
        description=(
            "How far ahead of its tick a due check is claimed; its worker waits in the slot "
            "until the tick (Redis time), so it starts on time. Beat claims the checks "
            "entering the lead together, at most every half lead: a longer lead makes fewer, "
            "larger ticks (less Redis work per run) and holds a claimed slot idle up to the "
            "lead (slots are claimed in tick order, and only free ones; docs/scale.md measures "
            "the trade). 0 = claim only when due."
        ),
        bound=Bound(0, 5),
        duration=True,
    )
    lease_margin: float = setting(
        5.0,
        description="How long a claim outlives the hard time limit before it is reaped as lost.",
        bound=Bound(0, 3_600, note="1 hour"),
        duration=True,
    )
    results_history: int = setting(
        100,
        description="Results kept per check in its capped results stream.",
        bound=Bound(1, 100_000),
    )

    # --- check state and transitions -----------------------------------------------------
    failure_threshold: int = setting(
        3,
        description=(
            "Consecutive failures before a region of a check is down (a check may set its own)."
        ),
        bound=Bound(1, 100),
    )
    success_threshold: int = setting(
        2,
        description=(
            "Consecutive successes before a region of a check is up again (a check may set its "
            "own)."
        ),
        bound=Bound(1, 100),
    )
    transitions_history: int = setting(
        100,
        description="Transitions kept per check in its capped transitions stream.",
        bound=Bound(1, 100_000),
    )
    tenant_transitions_history: int = setting(
        1000,
        description="Transitions kept per tenant in its capped transitions stream.",
        bound=Bound(1, 1_000_000),
    )
    transition_queue: str = Field(
        "celery",
        description="The Celery queue the @on_transition hooks run from (a worker consumes it).",
    )
    transition_timeout: float = setting(
        30.0,
        description=(
            "Time limit of one delivery of a transition to the hooks; a delivery not finished "
            "2 s after it (worker killed) is published again."
        ),
        bound=Bound(0, 3_600, low_open=True, note="1 hour"),
        duration=True,
    )
    transition_retries: int = setting(
        10,
        description=(
            "Retries of a delivery whose notification target failed or whose hook raised "
            "(backoff 1 s, 2 s, 4 s, ... at most 300 s, by the queue: 10 ride out a receiver "
            "down for about 17 minutes) before it is kept as failed."
        ),
        bound=Bound(0, 1_000),
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
    metrics_checks_page_size: int = setting(
        1000,
        description=(
            "Checks per page of beat's per-check exporter (`/metrics/checks?page=N`); a scrape "
            "reads no more than one page."
        ),
        bound=Bound(1, 100_000),
    )

    @field_validator("imports", "regions", "allowed_target_addresses", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return split_list(value)

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

    @field_validator("cron_monitor")
    @classmethod
    def _cron_monitor(cls, value: str) -> str:
        words = [w.strip() for w in value.split(",") if w.strip()]
        if value.strip() in ("all", "none"):
            return value.strip()
        if not words or any(not is_id(w) or w in ("all", "none") for w in words):
            raise ValueError(
                f"must be 'all', 'none' or a comma-separated list of task ids ({ID_RULE})"
            )
        return ",".join(words)

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

    @field_validator("*", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        """A declared duration: seconds or ISO 8601, range-checked before a timedelta is built
        (``1e20`` seconds or ``inf`` would otherwise raise OverflowError, a raw traceback instead
        of a message), kept as the field's type (``timedelta``, else float seconds)."""
        assert info.field_name is not None
        field = cls.model_fields[info.field_name]
        declaration = declared(field)
        if not declaration.duration or declaration.bound is None:
            return value
        given = duration(value)
        seconds = given.total_seconds()
        if not declaration.bound.allows(seconds):
            raise ValueError(f"must be a duration {declaration.bound.text()} ({DURATION_FORMS})")
        return given if field.annotation is timedelta else seconds

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

    @field_validator("*")
    @classmethod
    def _within(cls, value: Any, info: ValidationInfo) -> Any:
        """A declared range of a number (a duration's was checked as it was read)."""
        assert info.field_name is not None
        declaration = declared(cls.model_fields[info.field_name])
        bound = declaration.bound
        if bound is None or declaration.duration or bound.allows(value):
            return value
        kind = "an integer" if isinstance(value, int) else "a finite number"
        raise ValueError(f"must be {kind} {bound.text()}")

    @model_validator(mode="after")
    def _cross_field(self) -> Settings:
        if is_cluster_url(self.redis_url) and not self.broker_url:
            raise ValueError(
                f"{_name('broker_url')} must be set when {_name('redis_url')} is a Redis Cluster: "
                "the broker stays a plain or Sentinel Redis (kombu has no Cluster transport, "
                "celery/celery#2852)"
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


#: The range of every bounded setting, as its declaration gives it.
BOUNDS: dict[str, Bound] = {
    name: bound
    for name, info in Settings.model_fields.items()
    if (bound := declared(info).bound) is not None
}
