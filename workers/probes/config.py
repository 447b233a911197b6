"""Turning a pydantic validation failure into one error that names the field and what is allowed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ProbeConfigError(ValueError):
    """A check's config is invalid for its kind; the message names each bad field."""


def parse_config(kind: str, model: type[Model], config: Mapping[str, Any]) -> Model:
    """Validate ``config`` for ``kind`` or raise ProbeConfigError naming every bad field."""
    if not isinstance(config, Mapping):
        raise ProbeConfigError(
            f"{kind} check config must be an object, got {type(config).__name__}"
        )
    try:
        return model.model_validate(dict(config))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(config)"
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                allowed = ", ".join(sorted(model.model_fields))
                message = f"unknown field (allowed: {allowed})"
            problems.append(f"{where}: {message}")
        raise ProbeConfigError(f"invalid {kind} check config: " + "; ".join(problems)) from None
