"""The registry of check kinds: a probe function plus the validator of its target and config.

Why in celery_app: the store validates definitions (CLI, beat) and the workers run the probes,
and they never import each other. Built-in kinds (http, tcp) register from ``workers.probes``,
user kinds from modules in ``CHECKBEAT_IMPORTS``; CLI commands call
``app.loader.import_default_modules()`` so every kind is known before a definition is checked.

A validator is ``validate(target: str, config: dict) -> dict`` returning the normalized config.
It raises :class:`~celery_app.errors.CheckFieldError` naming the field (``"target"`` or
``"config.<key>"``); a plain ``ValueError`` is reported against ``config``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_app.errors import CheckFieldError

Validator = Callable[[str, dict[str, Any]], dict[str, Any]]
Probe = Callable[..., Any]


@dataclass(frozen=True)
class CheckKind:
    """One registered kind: its name, the probe that runs it, and its config validator."""

    name: str
    probe: Probe
    validate: Validator | None = None


_kinds: dict[str, CheckKind] = {}


def check_kind(name: str, *, validate: Validator | None = None) -> Callable[[Probe], Probe]:
    """Register the decorated function as the probe of kind ``name``.

    Registering the same name twice with a different function is an error (two modules
    fighting over a kind would make results depend on import order); re-importing the same
    function is fine.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"check kind name {name!r}: use letters, digits, '-' and '_'")

    def register(probe: Probe) -> Probe:
        existing = _kinds.get(name)
        if existing is not None and _qualname(existing.probe) != _qualname(probe):
            raise ValueError(
                f"check kind {name!r} is already registered by {_qualname(existing.probe)}"
            )
        _kinds[name] = CheckKind(name=name, probe=probe, validate=validate)
        return probe

    return register


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def get_kind(name: str) -> CheckKind:
    """The registered kind, or a CheckFieldError on ``kind`` listing the known ones."""
    try:
        return _kinds[name]
    except KeyError:
        known = ", ".join(sorted(_kinds)) or "none registered"
        raise CheckFieldError("kind", f"unknown kind {name!r} (known: {known})") from None


def registered_kinds() -> list[str]:
    return sorted(_kinds)


def unregister_kind(name: str) -> None:
    """Forget a kind (tests register throwaway kinds)."""
    _kinds.pop(name, None)


def validate_check_config(kind: str, target: str, config: dict[str, Any]) -> dict[str, Any]:
    """Validate ``target``/``config`` with the kind's validator; return the normalized config."""
    registered = get_kind(kind)
    if not isinstance(config, dict):
        raise CheckFieldError("config", f"must be a JSON object, got {type(config).__name__}")
    if registered.validate is None:
        return dict(config)
    try:
        normalized = registered.validate(target, dict(config))
    except CheckFieldError:
        raise
    except (ValueError, TypeError) as exc:
        raise CheckFieldError("config", str(exc)) from None
    if not isinstance(normalized, dict):
        raise TypeError(f"validator of kind {kind!r} must return a dict, got {normalized!r}")
    return normalized
