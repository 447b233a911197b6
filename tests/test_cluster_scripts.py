"""Lua scripts, pipelines and keyless commands on a Redis Cluster (the ``redis_cluster``
fixture): a pipelined EVALSHA and TIME are queued (redis-py blocks both in cluster pipelines), a
script whose cache a node lost is loaded again (at once for a direct call, from the next call in
a pipeline), TIME comes from the node of the check half, and a call or transaction that would
span the two halves is refused before it is sent."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException
from support.partitions import pinned

from celery_app.redis.client import get_redis
from celery_app.redis.clock import from_time_reply, server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CHECKS_TAG, JobField
from celery_app.redis.scripts import run_script
from celery_app.settings import load_settings

pytestmark = pytest.mark.timeout(60)


def _flush_scripts(cluster) -> None:
    for node in cluster.nodes:
        with node.client() as client:
            client.script_flush()


def test_scripts_and_pipelines_on_a_cluster(redis_cluster):
    settings = load_settings(redis_url=redis_cluster.url(), broker_url=redis_cluster.broker_url())
    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings)
    assert isinstance(client, redis.RedisCluster)
    # u and v share the first partition of the check half (one slot), the one ``keys`` names
    u, v = (f"{pinned(keys, name)}@eu" for name in ("u", "v"))
    owner = redis_cluster.node_of_slot(key_slot(CHECKS_TAG.encode()))
    assert client.get_default_node().port == owner.port  # keyless commands: the check half's
    client.hset(keys.job(u), JobField.TENANT, "acme")
    client.zadd(keys.due(), {u: 5.0})

    pipe = client.pipeline(transaction=False)
    run_script(pipe, "due", [keys.due()], [10.0, 100])
    run_script(pipe, "tenants", [keys.job(u), keys.job(v)])
    pipe.time()
    due, tenants, now = pipe.execute()
    assert (due, tenants) == (u, "acme\n")
    assert abs(from_time_reply(now) - server_time(client)) < 5

    _flush_scripts(redis_cluster)  # as a node restarted at the same address would have
    assert run_script(client, "due", [keys.due()], [10.0, 100]) == u  # redis-py reloads
    _flush_scripts(redis_cluster)
    pipe = client.pipeline(transaction=False)
    run_script(pipe, "due", [keys.due()], [10.0, 100])
    with pytest.raises(NoScriptError):
        pipe.execute()
    pipe = client.pipeline(transaction=False)  # the next pipelined call loads it again
    run_script(pipe, "due", [keys.due()], [10.0, 100])
    assert pipe.execute() == [u]

    with pytest.raises(RedisClusterException, match="same key slot"):
        run_script(client, "tenants", [keys.job(u), keys.cron_stats("t")])
    tx = client.pipeline(transaction=True)
    tx.hset(keys.rate_limit("acme"), "rate", "1")
    tx.sadd(keys.rate_limited_tenants(), "acme")
    assert tx.execute() == [1, 1]  # one half: one slot, one MULTI
    tx = client.pipeline(transaction=True)
    tx.sadd(keys.rate_limited_tenants(), "x")
    tx.sadd(keys.tenants(), "x")
    with pytest.raises(RedisClusterException, match="same slot"):
        tx.execute()


def _getkeys_calls(cluster) -> int:
    """COMMAND GETKEYS calls every node has served (``cmdstat_command|getkeys`` or, before
    Redis 7 names subcommands, ``cmdstat_command``)."""
    total = 0
    for node in cluster.nodes:
        with node.client() as client:
            stats = client.info("commandstats")
        total += sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_command"))
    return total


def test_a_pipelined_script_is_routed_by_its_own_keys_without_asking_a_node(redis_cluster):
    """A script's keys are movable, so redis-py's cluster pipeline asks the default node for
    them (COMMAND GETKEYS) before each pipelined EVALSHA: a round trip per script call, all on
    one master. checkbeat's pipeline reads them from the call's arguments."""
    settings = load_settings(
        redis_url=redis_cluster.url(),
        broker_url=redis_cluster.broker_url(),
        check_partitions=12,
    )
    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings)
    for part in keys.every_partition():  # a warm-up: every script loaded on every primary
        pipe = client.pipeline(transaction=False)
        run_script(pipe, "due", [part.due()], [10.0, 100])
        pipe.execute()
    before = _getkeys_calls(redis_cluster)
    for part in keys.every_partition():
        client.zadd(part.due(), {f"u{part.partition}@eu": 5.0})
        pipe = client.pipeline(transaction=False)
        run_script(pipe, "due", [part.due()], [10.0, 100])
        pipe.time()
        due, _now = pipe.execute()
        assert due == f"u{part.partition}@eu"
    assert _getkeys_calls(redis_cluster) == before
