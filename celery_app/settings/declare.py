"""How a setting is declared: :func:`setting` gives one field its default, description, allowed
range, unit and whether it is a duration, and the model, the error messages and the docs table
all read them from that one declaration with the field's type (:func:`declared`,
:func:`described`): a ``timedelta`` field is a duration by its type, in seconds.

Also the value forms every source shares: durations (seconds or ISO 8601), lists (commas or
JSON), listen addresses, and URLs with their password masked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

ENV_PREFIX = "CHECKBEAT_"
#: The namespace of checkbeat's keys in a Celery app's configuration (``app.conf.checkbeat_x``).
CONF_PREFIX = "checkbeat_"
#: The conf key where an app keeps its validated Settings; not a setting itself.
SETTINGS_CONF_KEY = "checkbeat_settings"

CommaList = Annotated[list[str], NoDecode]

DAY_S = 86_400
DAY_MS = DAY_S * 1000
DURATION_FORMS = "seconds such as 10 or 1.5, or ISO 8601 such as PT10S"
_ISO_DURATION = TypeAdapter(timedelta)


def env_name(name: str) -> str:
    """The environment variable of setting ``name`` (``pool_size`` -> ``CHECKBEAT_POOL_SIZE``)."""
    return f"{ENV_PREFIX}{name.upper()}"


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


@dataclass(frozen=True)
class _Declaration:
    """What :func:`setting` keeps in a field's metadata (which pydantic carries and otherwise
    ignores), before the field's type is known."""

    bound: Bound | None
    unit: str
    duration: bool


@dataclass(frozen=True)
class Declared:
    """A field's declaration read with its type: its range (in its unit) and whether it is a
    duration (read as seconds or ISO 8601, kept as the field's type: ``timedelta`` or float
    seconds)."""

    bound: Bound | None = None
    duration: bool = False


def setting(
    default: Any = None,
    description: str = "",
    *,
    bound: Bound | None = None,
    unit: str = "",
    duration: bool = False,
) -> Any:
    """One setting's field: ``bound`` (a duration's in seconds, else in ``unit``) is checked on
    every source and stated at the end of the description (:func:`described`), so the docs
    table states it too. A ``timedelta`` field is a duration by its type; ``duration=True``
    says it of a number of seconds kept as a float."""
    info = Field(default, description=description)
    if bound is not None or duration:
        info.metadata.append(_Declaration(bound, unit, duration))
    return info


def declared(info: FieldInfo) -> Declared:
    """What a field's :func:`setting` declared, with what its type says (nothing more for a
    plain field)."""
    by_type = info.annotation is timedelta
    for item in info.metadata:
        if isinstance(item, _Declaration):
            duration = item.duration or by_type
            unit = "s" if duration else item.unit
            bound = item.bound
            if bound is not None and unit:
                bound = replace(bound, unit=f" {unit}")
            return Declared(bound, duration)
    return Declared(None, by_type)


def described(info: FieldInfo) -> str:
    """A field's description as the docs table and ``checkbeat settings`` show it: with its
    range at the end, when it has one."""
    bound = declared(info).bound
    text = info.description or ""
    return text if bound is None else f"{text} Allowed: {bound.text()}."


def split_list(value: Any) -> Any:
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


def duration(value: Any) -> timedelta:
    """A duration setting as a timedelta; ValueError (never OverflowError) when unreadable."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"must be a duration ({DURATION_FORMS}), got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                return _ISO_DURATION.validate_python(text)
            except (ValidationError, OverflowError):
                raise ValueError(f"must be a duration ({DURATION_FORMS})") from None
    elif isinstance(value, int | float):
        seconds = float(value) if abs(value) < 1e300 else math.inf
    else:
        raise ValueError(f"must be a duration ({DURATION_FORMS}), got {value!r}")
    if not math.isfinite(seconds) or abs(seconds) > 1e12:  # beyond what timedelta can hold
        return timedelta.max if not seconds < 0 else timedelta.min  # NaN too: refused by bounds
    return timedelta(seconds=seconds)
