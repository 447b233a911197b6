"""The Lua scripts in ``celery_app/redis/lua``, loaded once per process and run on any client.

Why Lua: every multi-key change of a job (claim, completion, reconcile) must be atomic across
beats, workers and the CLI, and must cost one round trip per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script


@cache
def lua_source(name: str) -> str:
    return resources.files("celery_app").joinpath("redis", "lua", f"{name}.lua").read_text()


@cache
def _script(name: str) -> Script:
    # A Script only needs a client for its encoder; every call passes the client to run on.
    return Script(redis.Redis(), lua_source(name))


def run_script(
    client: redis.Redis | redis.client.Pipeline,
    name: str,
    keys: Sequence[str] = (),
    args: Sequence[Any] = (),
) -> Any:
    """Run ``celery_app/redis/lua/<name>.lua`` on ``client`` (a pipeline queues it instead).

    EVALSHA first; redis-py loads the script on NOSCRIPT (also inside a pipeline).
    """
    return _script(name)(keys=list(keys), args=list(args), client=client)
