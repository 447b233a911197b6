"""Secrets out of what checkbeat shows: URL passwords and credential headers of check configs.

Why: a tenant's check may carry credentials (``https://user:pass@host/`` or an
``Authorization`` header); ``checks show`` and ``checks list`` are read by operators and pasted
into tickets, so they print ``***`` instead. The stored definition keeps the real values (the
probe needs them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_app.settings import redact_url

MASK = "***"
#: Header names (lower case) whose values are credentials.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-access-token",
    }
)


def redact_target(target: str) -> str:
    return redact_url(target) if "://" in target else target


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(config)
    headers = out.get("headers")
    if isinstance(headers, Mapping):
        out["headers"] = {
            name: MASK if str(name).lower() in SECRET_HEADERS else value
            for name, value in headers.items()
        }
    return out


def redact_definition(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``CheckDefinition.as_dict()`` with its target and config redacted."""
    out = dict(data)
    out["target"] = redact_target(str(out.get("target", "")))
    out["config"] = redact_config(out.get("config") or {})
    return out
