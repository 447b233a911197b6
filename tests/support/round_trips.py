"""Round-trip counting for the tests: :mod:`bench.round_trips`' counting client, and which of
its sends are the dispatcher's own.
"""

from __future__ import annotations

import redis

from bench.round_trips import command_name, counting_client
from celery_app.redis.scripts import lua_source

__all__ = ["counting_client", "preload_scripts", "state_round_trips"]


def state_round_trips(sends: list[bytes]) -> list[bytes]:
    """The sends that are not redis-py's own script bookkeeping (SCRIPT EXISTS / LOAD, which
    depend on the script cache and on how pipelines queue scripts, not on the dispatcher)."""
    return [s for s in sends if command_name(s) != "SCRIPT"]


def preload_scripts(client: redis.Redis, *names: str) -> None:
    """Load scripts first, so a count does not include a first call's NOSCRIPT retry."""
    for name in names:
        client.script_load(lua_source(name))
