"""Where each running process serves its metrics, kept in one Redis hash.

Why in Redis: ``checkbeat status --json`` (and the live view of ``checkbeat up``) run in another
process, maybe on another machine, and port 0 means the port is only known once bound. Each
server rewrites its entry every :data:`REFRESH_S`; entries older than :data:`STALE_S` belong
to processes that died without removing theirs and are not listed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from celery_app.redis.schema import Keys

REFRESH_S = 10.0
STALE_S = 60.0


def register(client: redis.Redis, keys: Keys, name: str, url: str, role: str) -> None:
    entry = {"name": name, "url": url, "role": role, "at": time.time()}
    client.hset(keys.metrics_endpoints(), name, json.dumps(entry))


def unregister(client: redis.Redis, keys: Keys, name: str) -> None:
    client.hdel(keys.metrics_endpoints(), name)


def endpoints(client: redis.Redis, keys: Keys, now: float | None = None) -> list[dict[str, Any]]:
    """The live entries ({name, url, role, at}), sorted by name; stale ones are left out."""
    now = time.time() if now is None else now
    rows = []
    for raw in client.hvals(keys.metrics_endpoints()):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if now - float(entry.get("at", 0)) <= STALE_S:
            rows.append(entry)
    return sorted(rows, key=lambda e: e["name"])
