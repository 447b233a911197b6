"""Guards shared by the pure modules: every instant must carry its timezone."""

from __future__ import annotations

from datetime import datetime


def require_aware(value: datetime, name: str) -> datetime:
    """Return ``value`` unchanged, or raise if it is naive.

    A naive datetime would be read in the machine's local zone, so the same input could
    schedule differently on two hosts; refusing it is cheaper than explaining that later.
    """
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError(
            f"{name} must be timezone-aware (got naive {value.isoformat()}); "
            "attach a tzinfo, e.g. datetime.now(timezone.utc)"
        )
    return value
