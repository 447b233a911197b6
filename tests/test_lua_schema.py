"""Every Lua script touches only the keys its call declares and names only schema fields.

Static: no script spells a key or a field (no string literal holding ':' or outside a short list
of command names and reply words), and every ``JOB.X``-style name it uses exists in the schema.
Dynamic: every script is loaded with a guard in front that checks, for each ``redis.call``, that
its key arguments (and any argument that looks like a key) are in this call's KEYS and that the
hash fields it names are schema fields; then a workload drives every script on a real Redis.
Standalone Redis does not enforce declared keys itself (only Redis Cluster would), hence the
guard.
"""

from __future__ import annotations

import re

import pytest
import redis
from redis.commands.core import Script
from support.checks import at, learned, register_fake_worker
from support.completion import finish
from support.health import drive_transition_scripts
from support.partitions import first_partition_names

from celery_app.checks import claiming
from celery_app.checks.abandon import Abandoned, abandon_run
from celery_app.checks.dispatch import Dispatcher, RefillNeeds
from celery_app.checks.ratelimit import clear_rate_limit, set_rate_limit
from celery_app.checks.repair import repair
from celery_app.checks.start_read import read_start
from celery_app.redis import scripts
from celery_app.redis.schema import LUA_FIELD_TABLES, JobField, split_job_id
from scheduling_core import LANE_FAST

T0 = 1_780_000_000.0
#: The checks below share the first partition, the one its keys and dispatcher read (each
#: script then touches the slot the guard declares).
U, J = first_partition_names()

SCRIPTS = scripts.script_names()

# Literals a script may spell: Redis commands and their options, its own reply words, Lua
# string patterns and formats, separators. Anything else would be a key or a field name.
COMMANDS = {
    "DEL", "EXISTS", "GET", "HDEL", "HEXISTS", "HGET", "HGETALL", "HINCRBY", "HLEN", "HMGET",
    "HSET", "HSETNX", "INCR", "LPUSH", "LTRIM", "PUBLISH", "SADD", "SET", "XX",
    "SISMEMBER", "SMEMBERS", "SREM", "XADD", "ZADD", "ZCARD", "ZMSCORE", "ZRANGE",
    "ZRANGEBYSCORE", "ZREM", "ZSCORE", "ZPOPMIN", "TIME",
}  # fmt: skip
OTHER_LITERALS = {
    "WITHSCORES", "LIMIT", "MAXLEN", "NX", "PX", "*", "-inf",  # command options
    "ok", "exists", "conflict", "missing", "stale", "full", "limit", "more", "done",  # replies
    "delete",  # store.lua's change op
    "torn job field ",  # complete.lua's error reply for a job whose run count is no number
    "%S+", "%d+", "(%d+) (%d+) (%d)", "%.3f", "%.6f", "%d", "([^,]+)",  # patterns and formats
    "", " ", "\\n", ".", "0", "1", "#", "|", ",",  # separators, flags
}  # fmt: skip


def lua_bodies() -> dict[str, str]:
    """Each script as loaded, its ``--#include`` lines expanded."""
    return {name: scripts.lua_body(name) for name in SCRIPTS}


def literals_and_names(source: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The string literals of a Lua source outside comments, and its ``TABLE.NAME`` uses."""
    code = []
    literals = []
    i = 0
    while i < len(source):
        if source.startswith("--", i):
            i = source.find("\n", i) if "\n" in source[i:] else len(source)
            continue
        ch = source[i]
        if ch in "'\"":
            end = i + 1
            while source[end] != ch:
                end += 2 if source[end] == "\\" else 1
            literals.append(source[i + 1 : end])
            code.append(" ")
            i = end + 1
            continue
        code.append(ch)
        i += 1
    tables = "|".join(LUA_FIELD_TABLES)
    names = re.findall(rf"\b({tables})\.([A-Z_]+)\b", "".join(code))
    return literals, names


def test_every_script_is_documented_and_spells_no_key_nor_field():
    assert {"claim", "complete", "promote", "release", "store"} <= set(SCRIPTS)
    for name, body in lua_bodies().items():
        assert body.startswith("--") and "KEYS" in body.split("\n\n")[0], f"{name}: no KEYS doc"
        literals, names = literals_and_names(body)
        for literal in literals:
            assert ":" not in literal, f"{name}.lua spells a key: {literal!r}"
            assert literal in COMMANDS | OTHER_LITERALS, f"{name}.lua spells {literal!r}"
        for table, member in names:
            assert member in LUA_FIELD_TABLES[table].__members__, f"{name}.lua: {table}.{member}"


def test_no_script_receives_a_key_prefix():
    """The prefix helpers are gone: nothing can hand a script a prefix to build keys from."""
    from celery_app.redis.schema import Keys

    assert not [m for m in dir(Keys) if m.endswith("_prefix")]


# --- the dynamic guard ------------------------------------------------------------------------

GUARD = """
local __declared = {}
for _, k in ipairs(KEYS) do __declared[k] = true end
local __KEY_ARGS = {HGET=1, HGETALL=1, HMGET=1, HSET=1, HSETNX=1, HDEL=1, HEXISTS=1, HINCRBY=1,
  ZADD=1, ZREM=1, ZSCORE=1, ZMSCORE=1, ZRANGE=1, ZRANGEBYSCORE=1, ZCARD=1, SMEMBERS=1, SADD=1,
  SREM=1, SISMEMBER=1, INCR=1, GET=1, SET=1, XADD=1, EXISTS='all', DEL='all', TIME=0, PUBLISH=0}
-- channels are not keys (not declared); a script may publish only on checkbeat's own
local __CHANNELS = {['%(wake)s'] = true}
local __FIELDS = {HGET='rest', HMGET='rest', HDEL='rest', HEXISTS='rest', HINCRBY='one',
  HSET='pairs', HSETNX='one', XADD='stream'}
local __allowed = {}
for name in string.gmatch('%(fields)s', '%%S+') do __allowed[name] = true end
local function __field(cmd, f)
  -- a transition id (<uid>#<seq>) is data, like a region: the payload and failed hashes' field
  if type(f) == 'string' and string.match(f, '^[%%w_.%%-]+#%%d+$') then return end
  if not __allowed[f] then error('guard: ' .. cmd .. ' names field ' .. tostring(f)) end
end
local function __guarded(cmd, ...)
  local args = {...}
  local spec = __KEY_ARGS[cmd]
  if spec == nil then error('guard: the guard does not know ' .. cmd) end
  if cmd == 'PUBLISH' and not __CHANNELS[args[1]] then
    error('guard: PUBLISH on an unknown channel ' .. tostring(args[1]))
  end
  for i = 1, (spec == 'all') and #args or spec do
    if not __declared[args[i]] then
      error('guard: ' .. cmd .. ' touches undeclared key ' .. tostring(args[i]))
    end
  end
  for _, a in ipairs(args) do
    if type(a) == 'string' and string.sub(a, 1, %(plen)d) == '%(prefix)s' and not __declared[a]
        and not __CHANNELS[a] then
      error('guard: ' .. cmd .. ' passes undeclared key ' .. a)
    end
  end
  local kind = __FIELDS[cmd]
  if kind == 'rest' then
    for i = 2, #args do __field(cmd, args[i]) end
  elseif kind == 'one' then
    __field(cmd, args[2])
  elseif kind == 'pairs' then
    for i = 2, #args, 2 do __field(cmd, args[i]) end
  elseif kind == 'stream' then
    local star = 2
    while args[star] ~= '*' do star = star + 1 end
    for i = star + 1, #args, 2 do __field(cmd, args[i]) end
  end
  return redis.call(cmd, ...)
end
"""


class Guard:
    """The scripts as loaded under the guard, and the names of those that ran."""

    def __init__(self, keys, settings) -> None:
        fields = {str(f.value) for table in LUA_FIELD_TABLES.values() for f in table}
        fields |= set(settings.regions)  # the last-result hash is keyed by region
        prefix = keys.prefix + ":"
        self.guard = GUARD % {
            "fields": " ".join(sorted(fields)),
            "prefix": prefix,
            "plen": len(prefix),
            "wake": keys.dispatch_wake(),
        }
        self.ran: set[str] = set()
        self._loaded: dict[str, Script] = {}

    def source(self, body: str) -> str:
        return scripts.lua_preamble() + self.guard + body.replace("redis.call(", "__guarded(")

    def script(self, name: str) -> Script:
        script = self._loaded.get(name)
        if script is None:
            body = scripts.lua_body(name)
            script = self._loaded[name] = Script(redis.Redis(), self.source(body))
        self.ran.add(name)
        return script


@pytest.fixture
def guarded(monkeypatch, keys, settings) -> Guard:
    """Every script is loaded with the guard in front (run_script picks them up)."""
    guard = Guard(keys, settings)
    monkeypatch.setattr(scripts, "_script", guard.script)
    monkeypatch.setattr(scripts, "_sha", lambda name: guard.script(name).sha)
    return guard


def test_the_guard_refuses_an_undeclared_key_and_a_foreign_field(guarded, r, keys):
    job = keys.job("a@eu")
    assert r.eval(guarded.source("return redis.call('HSET', KEYS[1], JOB.LEASE_TOKEN, 1)"), 1, job)
    built = guarded.source("return redis.call('HGET', KEYS[1] .. 'x', JOB.LEASE_TOKEN)")
    with pytest.raises(redis.ResponseError, match="undeclared key"):
        r.eval(built, 1, job)
    foreign = guarded.source("return redis.call('HGET', KEYS[1], 'nope')")
    with pytest.raises(redis.ResponseError, match="names field nope"):
        r.eval(foreign, 1, job)


def test_every_script_touches_only_declared_keys_and_schema_fields(
    guarded, r, keys, store, dispatcher_app, broker, monkeypatch
):
    from celery_app.local.embedded_redis import free_port
    from celery_app.publish import RedisBatchPublisher

    # store.lua: create, create_many, update (tenant, regions, weight), disable, enable, delete
    for i in range(4):
        store.create(
            now=at(T0 - 100),
            uid=U(f"a{i}"),
            tenant="acme",
            kind="testprobe",
            target="x",
            period=60,
            regions=["eu"],
        )
    defs = [
        store.create(
            now=at(T0 - 100), uid=U(f"b{i}"), tenant="beta", kind="testprobe", target="x", period=60
        )
        for i in range(2)
    ]
    store.delete(U("b1"))
    store.create_many([defs[1]], now=at(T0 - 100))
    store.update(U("b0"), now=at(T0 - 100), tenant="gamma", regions=["eu", "us"], plan_weight=2)
    store.set_enabled(U("a3"), False, now=at(T0 - 100))
    store.set_enabled(U("a3"), True, now=at(T0 - 100))
    # complete.lua (a learned cost), then rate limits, workers
    learned(r, keys, store.params, J("a0"), scheduled_at=T0, cost_ms=3000.0, lane=1)
    for i in (1, 2, 3):
        learned(r, keys, store.params, J(f"a{i}"), scheduled_at=T0 + i * 0.1)
    set_rate_limit(r, keys, "acme", per_minute=1, burst=1)
    register_fake_worker(r, keys, "fast", region="eu", role="fast", concurrency=2)
    register_fake_worker(r, keys, "shared", region="eu", role="shared", concurrency=4)
    r.sadd(keys.region_workers("eu"), "expired")  # its key is gone: pruned by the claim

    # release.lua: publishing fails, the claims go back
    dead = RedisBatchPublisher(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(redis.ConnectionError):
        Dispatcher(dispatcher_app, client=r, publisher=dead).tick(T0 + 1)
    # due, promote, top, claim: one claim per bucket token, the rest held
    d = Dispatcher(dispatcher_app, client=r)
    report = d.tick(T0 + 1)
    assert report.claims and report.rate_limited
    assert r.zcard(keys.held("eu", LANE_FAST, "acme")) + r.zcard(keys.held("eu", 1, "acme"))
    # refill_needs.lua: what a refill of the region may find (held work: due now)
    needs = RefillNeeds(keys, "eu")
    pipe = r.pipeline(transaction=False)
    needs.prefetch(pipe)
    needs.prefetched(pipe.execute())
    assert needs.decide()[1] is True
    # a worker's start read of a claimed run (plain commands), which abandon.lua checks
    first = report.claims[0]
    uid = split_job_id(first.job_id)[0]
    start = read_start(r, keys, first.job_id, uid, first.lease_token, "celery-id", 60_000)
    assert start.first_delivery and start.job_hash and start.check_exists
    # abandon.lua: that run raised before its probe, its lease given back
    done = abandon_run(r, keys, store.params, first.job_id, first.lease_token, "celery-id",
                       scheduled_at=first.scheduled_at, now=T0 + 1.1)  # fmt: skip
    assert done.result == Abandoned.RELEASED
    for claim in report.claims[1:]:
        assert finish(
            r,
            keys,
            store.settings,
            claim.job_id,
            claim.lease_token,
            params=store.params,
            duration_ms=10.0,
            exec_start=at(T0 + 1),
            now=at(T0 + 1.1),
        )[0]
    # tokens come back: held jobs are released (claim.lua's release path), then the bucket goes
    assert d.tick(T0 + 70).claims
    clear_rate_limit(r, keys, "acme")
    d.tick(T0 + 140)
    # tenants.lua: too many rate-limited tenants to declare them all
    set_rate_limit(r, keys, "acme", per_minute=60, burst=5)
    monkeypatch.setattr(claiming, "MAX_DECLARED_TENANTS", 0)
    learned(r, keys, store.params, J("a1"), scheduled_at=T0 + 195)
    assert J("a1") in [c.job_id for c in d.tick(T0 + 200).claims]
    # the reaper finishes expired leases through complete.lua; the repair re-places jobs
    d.reap(T0 + 200 + d.lease_s + 1)
    r.zrem(keys.due(), J("a1"))
    r.zrem(keys.ready("eu", LANE_FAST), J("a1"))
    repair(r, keys, store.params, at(T0 + 300))
    # quarantine.lua: a job whose data breaks the promote is set aside
    r.hset(keys.job(J("a3")), JobField.EFFECTIVE_AT, "not-a-number")
    r.zadd(keys.due(), {J("a3"): T0})
    d.tick(T0 + 400)
    assert r.sismember(keys.quarantine(), J("a3"))
    store.delete(U("a2"))
    # state, transitions and maintenance: complete.lua's health part and the transition scripts
    drive_transition_scripts(r, keys, store, dispatcher_app, T0 + 400)

    # The cron scripts are driven under the same rule (keys from KEYS, schema fields) by
    # tests/test_cron_store.py; this workload covers the check side.
    check_side = {name for name in SCRIPTS if not name.startswith("cron_")}
    assert guarded.ran >= check_side, f"never exercised: {check_side - guarded.ran}"
