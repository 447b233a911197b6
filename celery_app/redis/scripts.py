"""The Lua scripts in ``celery_app/redis/lua``, loaded once per process and run on any client.

Why Lua: every multi-key change of a job (claim, completion, reconcile) must be atomic across
beats, workers and the CLI, and must cost one round trip per batch.

Every script gets every key it touches in KEYS, built by :class:`~celery_app.redis.schema.Keys`
(none builds a key from a prefix), and its field names from the schema's tables rendered as a
preamble: the schema reads in one file, and each call declares its keys as Redis Cluster needs.
Each script documents its KEYS and ARGV at its top.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any, cast

import redis
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_app.redis.pipelined_scripts import ScriptPipeline
from celery_app.redis.schema import LUA_FIELD_TABLES

log = logging.getLogger(__name__)

_loaded: set[tuple[str, str]] = set()


def load_on_primaries(pipe: ClusterPipeline, script: Script) -> None:
    """Load ``script`` on each primary of the cluster this process has not loaded it on yet
    (a primary that is new after a failover or a reshard is a new node name, so it is loaded
    there before its first pipelined EVALSHA)."""
    for node in pipe.get_primaries():
        mark = (node.name, script.sha)
        if mark not in _loaded:
            node.redis_connection.script_load(script.script)
            _loaded.add(mark)


def forget_loaded() -> None:
    """After a NOSCRIPT in a cluster pipeline (a node restarted at the same address lost its
    script cache): the next pipelined call loads every script again."""
    _loaded.clear()


class KeyTable:
    """The KEYS of one script call, each key once: ``table(key)`` is its number in KEYS
    (1-based, as Lua counts), so a payload can refer to keys by number."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def __call__(self, key: str) -> int:
        number = self._numbers.get(key)
        if number is None:
            number = self._numbers[key] = len(self._numbers) + 1
        return number

    @property
    def keys(self) -> list[str]:
        return list(self._numbers)


@cache
def lua_preamble() -> str:
    """The field-name tables of :mod:`celery_app.redis.schema` as Lua locals, e.g.
    ``local JOB = {SCHEDULED_AT='sa', ...}``: every script is loaded with them in front, so no
    script spells a field name of its own."""
    lines = []
    for table, fields in LUA_FIELD_TABLES.items():
        items = ", ".join(f"{member.name}='{member.value}'" for member in fields)
        lines.append(f"local {table} = {{{items}}}")
    return "\n".join(lines) + "\n"


def _lua_file(*parts: str) -> str:
    return resources.files("celery_app").joinpath("redis", "lua", *parts).read_text()


@cache
def lua_body(name: str) -> str:
    """``celery_app/redis/lua/<name>.lua`` with each line ``--#include <other>`` replaced by
    ``lua/include/<other>.lua`` (local functions two scripts share)."""
    lines = [
        _lua_file("include", f"{line.split()[1]}.lua") if line.startswith("--#include ") else line
        for line in _lua_file(f"{name}.lua").splitlines()
    ]
    return "\n".join(lines) + "\n"


@cache
def lua_source(name: str) -> str:
    """:func:`lua_body` with the field tables in front."""
    return lua_preamble() + lua_body(name)


@cache
def _script(name: str) -> Script:
    # A Script only needs a client for its encoder; every call passes the client to run on.
    return Script(redis.Redis(), lua_source(name))


def script_names() -> list[str]:
    """The name of every script in ``celery_app/redis/lua`` (not its includes)."""
    lua = resources.files("celery_app").joinpath("redis", "lua")
    return sorted(e.name[: -len(".lua")] for e in lua.iterdir() if e.name.endswith(".lua"))


def build_all() -> None:
    """Read, assemble and hash every script now (a worker's warm-up): the first calls of each
    would otherwise do it, racing, in several pool threads at once."""
    for name in script_names():
        _sha(name)


def load_all(client: Any) -> None:
    """``SCRIPT LOAD`` every script on ``client``'s server (beat's and a worker's start): a
    script first met in a pipeline is otherwise loaded and run again in one more round trip,
    after the pipeline's other commands (``redis/pipelined_scripts.py``), and a claim whose
    candidates missed a re-run promote reads them again. Only start-up cost saved: a failure
    is logged, and the first calls load the scripts as before."""
    try:
        for name in script_names():
            client.script_load(_script(name).script)
    except Exception as exc:  # redis-py's cluster errors are not all RedisErrors
        log.warning("checkbeat: could not load the Lua scripts at start (%s)", exc)


@cache
def _sha(name: str) -> str:
    # Fixed at load: a Script's own ``sha`` is rewritten by redis-py's reloads (bytes on a
    # client that does not decode).
    return _script(name).sha


@cache
def _call_kind(cls: type) -> str:
    """How :func:`run_script` calls a script on an instance of ``cls``: decided once per class
    (an ``isinstance`` against redis-py's pipeline classes goes through ``typing``'s protocol
    metaclass, a cost a run should not pay on every script call)."""
    if issubclass(cls, ScriptPipeline):
        return "bare"
    if issubclass(cls, ClusterPipeline):
        return "cluster"
    if issubclass(cls, redis.client.Pipeline):
        return "pipeline"
    return "client"


def _call_on_client(
    client: Any, name: str, script: Script, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """EVALSHA ``name`` on ``client``; on NOSCRIPT the script is loaded and called again."""
    try:
        return client.evalsha(_sha(name), len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.script)
        return client.evalsha(_sha(name), len(keys), *keys, *args)


def run_script(
    client: redis.Redis | redis.client.Pipeline | RedisCluster,
    name: str,
    keys: Sequence[str] = (),
    args: Sequence[Any] = (),
) -> Any:
    """Run ``celery_app/redis/lua/<name>.lua`` on ``client`` (a pipeline queues it instead).

    On a client: EVALSHA, and on NOSCRIPT (a restart, a failover, a ``SCRIPT FLUSH``) the script
    is loaded and called again. On the pipelines of checkbeat's own clients
    (:class:`~celery_app.redis.pipelined_scripts.ScriptPipeline`) a bare EVALSHA is queued, with
    no ``SCRIPT EXISTS`` round trip first; any other pipeline asks ``SCRIPT EXISTS`` as redis-py
    does. A Redis Cluster pipeline does neither, so the script is loaded on every primary first
    (:func:`load_on_primaries`).
    """
    script, kind = _script(name), _call_kind(type(client))
    if kind == "client":
        return _call_on_client(client, name, script, keys, args)
    if kind == "bare":
        pipe = cast(ScriptPipeline, client)  # _call_kind: its class is a ScriptPipeline
        if pipe.takes_bare_scripts():
            return pipe.queue_script(_sha(name), script.script, keys, args)
    if kind == "cluster":
        load_on_primaries(cast(ClusterPipeline, client), script)  # _call_kind: a ClusterPipeline
    return script(keys=list(keys), args=list(args), client=client)
