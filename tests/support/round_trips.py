"""A redis-py client that records each round trip it makes (one send, then its replies), and
which of its sends are the dispatcher's own.

Why: the dispatcher's cost per claim and per run is counted in round trips (each is redis-py
encoding and parsing plus kernel time); the tests assert the number and the benches
(``bench/refill_bench.py``) print it, both on a real redis-server.
"""

from __future__ import annotations

from collections import Counter

import redis

from celery_app.redis.scripts import lua_source


class CountingConnection(redis.Connection):
    """Records, per send, the packed bytes (a pipeline's commands go in one send)."""

    sends: list[bytes]

    def send_packed_command(self, command, check_health=True):
        packed = command if isinstance(command, bytes) else b"".join(command)
        self.sends.append(packed)
        return super().send_packed_command(command, check_health)


def counting_client(
    url: str, client_class: type[redis.Redis] = redis.Redis
) -> tuple[redis.Redis, list[bytes]]:
    """A ``client_class`` client of ``url`` and the list its round trips are appended to (every
    connection of its pool)."""
    sends: list[bytes] = []
    connection = type("Counting", (CountingConnection,), {"sends": sends})
    pool = redis.ConnectionPool.from_url(url, connection_class=connection, decode_responses=True)
    return client_class(connection_pool=pool), sends


def command_name(packed: bytes) -> str:
    """The first command of a send (``*N``, ``$len``, then the name), upper case."""
    return packed.split(b"\r\n", 3)[2].decode().upper()


def state_round_trips(sends: list[bytes]) -> list[bytes]:
    """The sends that are not redis-py's own script bookkeeping (SCRIPT EXISTS / LOAD, which
    depend on the script cache and on how pipelines queue scripts, not on the dispatcher)."""
    return [s for s in sends if command_name(s) != "SCRIPT"]


def preload_scripts(client: redis.Redis, *names: str) -> None:
    """Load scripts first, so a count does not include a first call's NOSCRIPT retry."""
    for name in names:
        client.script_load(lua_source(name))


def command_calls(client: redis.Redis) -> Counter[str]:
    """How many times the server has run each command (``INFO commandstats``, lower-case names,
    the commands inside Lua included): two readings' difference is what ran between them."""
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
