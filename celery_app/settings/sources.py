"""Where settings come from, highest first: explicit overrides (code), the environment
(``CHECKBEAT_*``), the app's conf (``app.conf.checkbeat_*``), the defaults of the model.

An error names a value as its source spells it (``CHECKBEAT_POOL_SIZE=0`` or
``app.conf.checkbeat_pool_size=0``), and an unknown ``checkbeat_*`` key in a conf is an error
listing close matches: a typo there must not be ignored. (Unknown ``CHECKBEAT_*`` variables are
ignored: an environment is shared with compose files and other tools.) The defaults a user's app
implies (its broker as the Redis URL, its timezone) rank with its conf
(:func:`with_app_defaults`); :func:`celery_app.factory.settings_from_conf` reads them off the app.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from celery_app.errors import CheckbeatError
from celery_app.settings.declare import CONF_PREFIX, SETTINGS_CONF_KEY, env_name, redact_url
from celery_app.settings.model import BOUNDS, LOADING, SECRET_FIELDS, Loading, Settings


class SettingsError(CheckbeatError, ValueError):
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
    token = LOADING.set(Loading(conf.values, names))
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
        LOADING.reset(token)


def with_app_defaults(
    given: ConfValues,
    *,
    state_url: str | None,
    sentinel_master: str | None,
    timezone: str | None,
) -> ConfValues:
    """``given`` plus the defaults a user's app implies, each named after the conf key it came
    from, where ``given`` has no value of its own: its redis://, rediss:// or sentinel:// broker
    (``state_url``) holds checkbeat's state, a Sentinel broker's ``master_name`` transport option
    is the Sentinels' master, its ``timezone`` is the default timezone of cron tasks."""
    values, names = dict(given.values), dict(given.names)
    implied = (
        ("redis_url", state_url, "app.conf.broker_url"),
        (
            "redis_sentinel_master",
            sentinel_master,
            "app.conf.broker_transport_options['master_name']",
        ),
        ("timezone", timezone, "app.conf.timezone"),
    )
    for name, value, key in implied:
        if name not in values and value:
            values[name], names[name] = value, key
    return ConfValues(values, names)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The environment's settings, read once per process: what ``create_app()`` without an
    argument (and so ``celery_app.app``) is built with.

    Nothing below the app calls this: code that has an app reads ``settings_of(app)``, code that
    has none takes the settings as an argument, so an app built with ``create_app(settings)`` is
    never judged by the environment. Tests call ``get_settings.cache_clear()``.
    """
    return load_settings()
