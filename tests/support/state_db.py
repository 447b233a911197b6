"""Reading the state db as a whole, for tests that prove a command wrote nothing."""

from __future__ import annotations

import redis


def snapshot(r: redis.Redis) -> dict[str, object]:
    """Every key of the db with its ``DUMP`` (type, value and encoding), in key order: two
    snapshots are equal only if nothing was written, created or removed in between."""
    return {key: r.dump(key) for key in sorted(r.scan_iter())}
