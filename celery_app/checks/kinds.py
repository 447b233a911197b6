"""The registry of check kinds: a probe function plus the validator of its target and config.

Why in celery_app: the store validates definitions (CLI, beat) and the workers run the probes,
and they never import each other. Kinds live in the app's registry (:mod:`celery_app.registry`):
built-in kinds (http, tcp) register as shared kinds from ``workers.probes``, user kinds from
modules in ``CHECKBEAT_IMPORTS``; CLI commands call ``app.loader.import_default_modules()`` so
every kind is known before a definition is checked.

A validator is ``validate(target: str, config: dict, settings: Settings) -> dict`` returning the
normalized config; ``settings`` are those of the app (or store) doing the validation, so a check
is judged by the configuration it will run under, not by the environment of the process. A
two-argument ``validate(target, config)`` (a kind that needs no settings) works too. It raises
:class:`~celery_app.errors.CheckFieldError` naming the field (``"target"`` or ``"config.<key>"``);
a plain ``ValueError`` is reported against ``config``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_app.errors import CheckFieldError
from celery_app.registry import KINDS, Registry, declaring_registry, origin_of

if TYPE_CHECKING:
    from celery import Celery

    from celery_app.settings import Settings

Validator = Callable[..., dict[str, Any]]
Probe = Callable[..., Any]


def _takes_settings(validate: Validator) -> bool:
    """Whether ``validate`` accepts a third positional argument (the settings)."""
    try:
        parameters = inspect.signature(validate).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the documented 2 args
        return False
    positional = 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 3


@dataclass(frozen=True)
class CheckKind:
    """One registered kind: its name, the probe that runs it, and its config validator."""

    name: str
    probe: Probe
    validate: Validator | None = None
    takes_settings: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        wants = self.validate is not None and _takes_settings(self.validate)
        object.__setattr__(self, "takes_settings", wants)

    def normalize(self, target: str, config: dict[str, Any], settings: Settings) -> Any:
        """The validator's result for ``target``/``config`` (the config itself without one)."""
        if self.validate is None:
            return dict(config)
        if self.takes_settings:
            return self.validate(target, dict(config), settings)
        return self.validate(target, dict(config))


def check_kind(
    name: str, *, validate: Validator | None = None, app: Celery | None = None
) -> Callable[[Probe], Probe]:
    """Register the decorated function as the probe of kind ``name``.

    A shared kind (every app knows it) unless ``app`` is given. Registering the same name twice
    with a different function is an error (two modules fighting over a kind would make results
    depend on import order); re-importing the same function is fine.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"check kind name {name!r}: use letters, digits, '-' and '_'")

    def register(probe: Probe) -> Probe:
        kind = CheckKind(name=name, probe=probe, validate=validate)
        declaring_registry(app).add(KINDS, name, kind, origin_of(probe))
        return probe

    return register


def get_kind(registry: Registry, name: str) -> CheckKind:
    """The kind registered as ``name``, or a CheckFieldError on ``kind`` listing the known ones."""
    entry = registry.get(KINDS, name)
    if entry is None:
        known = ", ".join(registered_kinds(registry)) or "none registered"
        raise CheckFieldError("kind", f"unknown kind {name!r} (known: {known})")
    kind: CheckKind = entry.value
    return kind


def registered_kinds(registry: Registry) -> list[str]:
    return sorted(registry.kinds())


def unregister_kind(name: str, *, app: Celery | None = None) -> None:
    """Forget a kind (tests register throwaway kinds): a shared one unless ``app`` is given."""
    declaring_registry(app).remove(KINDS, name)


def validate_check_config(
    registry: Registry, kind: str, target: str, config: dict[str, Any], settings: Settings
) -> dict[str, Any]:
    """Validate ``target``/``config`` with the validator of ``kind`` (as ``registry`` knows it)
    under ``settings``; return the normalized config."""
    registered = get_kind(registry, kind)
    if not isinstance(config, dict):
        raise CheckFieldError("config", f"must be a JSON object, got {type(config).__name__}")
    try:
        normalized = registered.normalize(target, config, settings)
    except CheckFieldError:
        raise
    except (ValueError, TypeError) as exc:
        raise CheckFieldError("config", str(exc)) from None
    if not isinstance(normalized, dict):
        raise TypeError(f"validator of kind {kind!r} must return a dict, got {normalized!r}")
    return normalized
