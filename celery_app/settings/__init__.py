"""Every knob of checkbeat, read from ``CHECKBEAT_*`` environment variables and, for a Celery app
of the user's own, from its ``app.conf.checkbeat_*`` keys, and validated once.

Why one class: beat, the workers and the CLI must agree on Redis, regions and the scheduling
knobs; reading them in one place, failing loudly on a bad value and naming the variable, is what
keeps a typo in a deployment from turning into a scheduler that silently does something else.

Each setting is declared once, as a field of :class:`Settings` built by
:func:`~celery_app.settings.declare.setting` (default, description, range, unit, duration); its
validation, its environment variable and conf key, its error messages and its row of the docs
table all follow from that declaration. The package by job:

- :mod:`.declare`: how a setting is declared, and the value forms (durations, lists, addresses);
- :mod:`.model`: the fields and the rules between them;
- :mod:`.sources`: overrides, the environment, the app's conf and the defaults the app implies,
  and the errors naming each;
- :mod:`.markdown`: the configuration table of docs/configuration.md (``checkbeat settings``).

Durations accept seconds (``"1.5"``) or ISO 8601 (``"PT1.5S"``). Lists accept commas
(``"eu,us"``) or JSON (``'["eu","us"]'``). Every number is bounded (:data:`BOUNDS`): NaN,
infinities and absurd magnitudes are refused with the variable's name and its allowed range,
because a NaN compares false with every minimum and an infinite lease is never reaped.
"""

from __future__ import annotations

from celery_app.settings.declare import (
    CONF_PREFIX,
    ENV_PREFIX,
    SETTINGS_CONF_KEY,
    Bound,
    CommaList,
    env_name,
    listen_address,
    redact_url,
    setting,
)
from celery_app.settings.markdown import settings_markdown
from celery_app.settings.model import BOUNDS, SECRET_FIELDS, Settings
from celery_app.settings.sources import (
    ConfEntry,
    ConfValues,
    SettingsError,
    conf_values,
    get_settings,
    load_settings,
    with_app_defaults,
)

__all__ = [
    "BOUNDS",
    "CONF_PREFIX",
    "ENV_PREFIX",
    "SECRET_FIELDS",
    "SETTINGS_CONF_KEY",
    "Bound",
    "CommaList",
    "ConfEntry",
    "ConfValues",
    "Settings",
    "SettingsError",
    "conf_values",
    "env_name",
    "get_settings",
    "listen_address",
    "load_settings",
    "redact_url",
    "setting",
    "settings_markdown",
    "with_app_defaults",
]
