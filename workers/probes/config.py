"""Turning a pydantic validation failure into a CheckFieldError that names the field.

Why: the check store shows a creation error to the user as it is (``config.method: ...``), and
nothing is written when one is raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from celery_app.errors import CheckFieldError

Model = TypeVar("Model", bound=BaseModel)


def parse_config(kind: str, model: type[Model], config: Mapping[str, Any]) -> Model:
    """Validate ``config`` for ``kind`` or raise CheckFieldError naming the (first) bad field.

    Every problem is listed in the message; ``field`` is the first one's ``config.<name>``.
    """
    if not isinstance(config, Mapping):
        raise CheckFieldError("config", f"must be an object, got {type(config).__name__}")
    try:
        return model.model_validate(dict(config))
    except ValidationError as exc:
        fields: list[str] = []
        problems: list[str] = []
        for error in exc.errors():
            where = ".".join(["config", *(str(part) for part in error["loc"])])
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                allowed = ", ".join(sorted(model.model_fields)) or "none"
                message = f"unknown field of a {kind} check (allowed: {allowed})"
            fields.append(where)
            problems.append(message if not problems else f"{where}: {message}")
        raise CheckFieldError(fields[0], "; ".join(problems)) from None
