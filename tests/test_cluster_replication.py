"""WAIT on a Redis Cluster (the ``redis_cluster_with_replicas`` fixture: three masters, one
replica each): a protected write's WAIT goes to the master that took the write, on the same
connection, after it (each master a pipeline writes to gets its own); a lagging replica is a
shortfall of its master alone; a write that a failover moved (MOVED, sent again alone by
redis-py) is a shortfall, not an error, and the next write waits on the promoted master; a
run's start takes Redis's time once its WAIT, on the job's master, has answered."""

from __future__ import annotations

import signal

import pytest
import redis
from redis.crc import key_slot
from support.polling import wait_for

from celery_app.checks.start_read import read_start
from celery_app.redis import replication
from celery_app.redis.client import get_redis
from celery_app.redis.clock import from_time_reply
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CheckField, JobField
from celery_app.settings import load_settings

pytestmark = pytest.mark.timeout(90)


def _tag_on(cluster, node) -> str:
    """A hash tag whose slot ``node`` (a master as started) owns."""
    n = 0
    while cluster.node_of_slot(key_slot(f"t{n}".encode())) is not node:
        n += 1
    return f"{{t{n}}}"


def _waits(node) -> int:
    """WAITs ``node`` has served."""
    with node.client() as client:
        return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def _on_replica(replica, key: str) -> str | None:
    """``key`` read on the replica itself (READONLY: a replica otherwise answers MOVED)."""
    with redis.Redis(port=replica.port, decode_responses=True, single_connection_client=True) as r:
        r.execute_command("READONLY")
        return r.get(key)


def _client(cluster, **settings):
    settings = {"redis_wait_replicas": 1, "redis_wait_timeout": 0.2} | settings
    loaded = load_settings(redis_url=cluster.url(), broker_url=cluster.broker_url(), **settings)
    return get_redis(loaded.redis_url, loaded), loaded


def _start_on_every_master(cluster, client, keys) -> dict[int, int]:
    """A run's start of a check on each master; the WAITs each master served meanwhile."""
    waits = {n.port: _waits(n) for n in cluster.nodes}
    for node in cluster.nodes:
        uid = next(
            f"u{n}"
            for n in range(1000)
            if cluster.node_of_slot(key_slot(keys.job(f"u{n}@eu").encode())) is node
        )
        job, part = f"{uid}@eu", keys.of_check(uid)
        client.hset(part.check(uid), mapping={CheckField.KIND: "http", CheckField.TARGET: "x"})
        client.hset(part.job(job), JobField.LEASE_TOKEN, "t1")
        assert read_start(client, part, job, uid, "t1", "celery-1", 60_000).first_delivery
    return {n.port: _waits(n) - waits[n.port] for n in cluster.nodes}


def test_by_default_a_write_waits_for_a_replica_where_its_master_has_one(
    redis_cluster_with_replicas,
):
    """A cluster's default (``CHECKBEAT_REDIS_WAIT_REPLICAS=-1``): a run's start waits for one
    replica on the master that took it, as under Sentinel, so a failover to a lagging replica
    cannot lose a started tick (tests/test_cluster_partitions.py kills a master to see it)."""
    cluster = redis_cluster_with_replicas
    client, settings = _client(cluster, redis_wait_replicas=-1, check_partitions=12)
    assert replication.wait_policy(client) == (replication.PER_MASTER, 200)
    before = replication.shortfalls()
    served = _start_on_every_master(cluster, client, state_keys(settings))
    assert served == {n.port: 1 for n in cluster.nodes}
    assert replication.shortfalls() == before


def test_by_default_a_master_without_a_replica_is_not_waited_for(redis_cluster):
    """The same default on a cluster whose masters have no replica: no WAIT at all, so no
    write stalls for the timeout and no shortfall is logged."""
    client, settings = _client(
        redis_cluster, redis_wait_replicas=-1, redis_wait_timeout=5, check_partitions=12
    )
    before = replication.shortfalls()
    served = _start_on_every_master(redis_cluster, client, state_keys(settings))
    assert served == {n.port: 0 for n in redis_cluster.nodes}
    assert replication.shortfalls() == before


def test_a_write_waits_on_its_own_master_and_a_lagging_replica_is_its_masters_shortfall(
    redis_cluster_with_replicas,
):
    cluster = redis_cluster_with_replicas
    client, settings = _client(cluster)
    keys = state_keys(settings)
    assert replication.wait_policy(client) == (1, 200)

    # the run's start: its WAIT on the job's master alone, and the marker on its replica
    owner = cluster.node_of_slot(key_slot(keys.job("c@eu").encode()))
    replica = cluster.replicas[cluster.nodes.index(owner)][0]
    client.hset(keys.check("c"), mapping={CheckField.KIND: "http", CheckField.TARGET: "http://x/"})
    client.hset(keys.job("c@eu"), JobField.LEASE_TOKEN, "t1")
    before, waits = replication.shortfalls(), {n.port: _waits(n) for n in cluster.nodes}
    read = read_start(client, keys, "c@eu", "c", "t1", "celery-1", 60_000)
    assert read.first_delivery
    assert _on_replica(replica, keys.run_started("c@eu", "t1")) == "celery-1"  # no polling
    assert replication.shortfalls() == before
    assert {n.port: _waits(n) - waits[n.port] for n in cluster.nodes} == {
        n.port: int(n is owner) for n in cluster.nodes
    }

    # one pipeline writing to two masters: a WAIT each, each on the connection that wrote
    a, b = cluster.nodes[0], cluster.nodes[1]
    key_a, key_b = f"{_tag_on(cluster, a)}:x", f"{_tag_on(cluster, b)}:x"

    def write_both(value: str) -> list[str]:
        pipe = client.pipeline(transaction=False)
        pipe.set(key_a, value)
        pipe.set(key_b, value)
        queued = replication.queue_wait(pipe, client)
        assert replication.took_wait(pipe.execute(), queued, client, "test") == [True, True]
        return queued

    names = {n.port: f"127.0.0.1:{n.port}" for n in cluster.nodes}
    assert write_both("1") == [names[a.port], names[b.port]]
    assert _on_replica(cluster.replicas[0][0], key_a) == "1"
    assert _on_replica(cluster.replicas[1][0], key_b) == "1"
    assert replication.shortfalls() == before

    # a's replica stops: a's WAIT falls short (the writes go on), then a alone is skipped
    lagging = cluster.replicas[0][0]
    lagging.process.send_signal(signal.SIGSTOP)
    try:
        assert write_both("2") == [names[a.port], names[b.port]]
        assert replication.shortfalls() == before + 1
        assert _on_replica(cluster.replicas[1][0], key_b) == "2"
        assert write_both("3") == [names[b.port]]  # a skipped for DEGRADED_S, b still waited
        assert replication.shortfalls() == before + 1
    finally:
        lagging.process.send_signal(signal.SIGCONT)


def test_a_write_a_failover_moved_is_a_shortfall_and_the_next_waits_on_the_new_master(
    redis_cluster_with_replicas,
):
    """A graceful ``CLUSTER FAILOVER``: the old master becomes the replica, and the client's
    slot table still names it. The script is answered MOVED there and sent again alone to the
    new master (its answer is right), the WAIT on the old connection covers nothing: a
    shortfall, not an error (the demoted node refuses WAIT). The next write waits on the new
    master, whose replica (the old master) acknowledges it."""
    cluster = redis_cluster_with_replicas
    client, _settings = _client(cluster)
    old, new = cluster.nodes[1], cluster.replicas[1][0]
    due = f"{_tag_on(cluster, old)}:due"
    client.zadd(due, {"j": 1.0})
    assert replication.run_replicated(client, "due", [due], ["5", 10], "test") == "j"
    before = replication.shortfalls()

    with new.client() as promoted:
        promoted.execute_command("CLUSTER FAILOVER", "TAKEOVER")

    def switched() -> bool:
        with old.client() as demoted, new.client() as promoted:
            return (
                promoted.info("replication").get("role") == "master"
                and demoted.info("replication").get("master_link_status") == "up"
            )

    wait_for(switched, 30, what="the replica promoted and the old master its replica")
    assert replication.run_replicated(client, "due", [due], ["5", 10], "test") == "j"
    assert replication.shortfalls() == before + 1
    waits = _waits(new)
    assert replication.run_replicated(client, "due", [due], ["5", 10], "test") == "j"
    assert replication.shortfalls() == before + 1  # acknowledged by the demoted master
    assert _waits(new) == waits + 1


def _calls(node, command: str) -> int:
    with node.client() as client:
        stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_runs_start_time_is_taken_after_its_wait_on_its_own_master(redis_cluster_with_replicas):
    """A partition away from the client's default node: the start read's WAIT goes to the
    partition's master, and the run's time is the server's once the WAIT has answered (the
    process's kept clock, read when the reply arrives), not from before it: a WAIT that blocked
    for its timeout (the replica stopped) moves the run's time by as long."""
    cluster = redis_cluster_with_replicas
    client, settings = _client(cluster, check_partitions=12, redis_wait_timeout=1.0)
    default = next(n for n in cluster.nodes if n.port == client.get_default_node().port)
    uid = next(
        f"u{n}"
        for n in range(1000)
        if cluster.node_of_slot(key_slot(state_keys(settings).job(f"u{n}@eu").encode()))
        is not default
    )
    keys = state_keys(settings).of_job(f"{uid}@eu")
    owner = cluster.node_of_slot(key_slot(keys.job(f"{uid}@eu").encode()))
    client.hset(keys.check(uid), mapping={CheckField.KIND: "http", CheckField.TARGET: "http://x/"})
    client.hset(keys.job(f"{uid}@eu"), JobField.LEASE_TOKEN, "t1")
    waits = {n.port: _waits(n) for n in cluster.nodes}
    with owner.client() as direct:
        before = from_time_reply(direct.time())
    replica = cluster.replicas[cluster.nodes.index(owner)][0]
    replica.process.send_signal(signal.SIGSTOP)
    try:
        read = read_start(client, keys, f"{uid}@eu", uid, "t1", "celery-1", 60_000)
    finally:
        replica.process.send_signal(signal.SIGCONT)
    with owner.client() as direct:
        after = from_time_reply(direct.time())
    assert read.first_delivery
    assert _waits(owner) == waits[owner.port] + 1
    assert _waits(default) == waits[default.port]
    assert before + 0.9 <= read.server_now <= after + 0.05  # after the WAIT's 1 s, not before
