"""Redis Sentinel for state and broker: the URL form kombu reads, the app's broker options, and
a real failover (one master, one replica, three Sentinels) followed by the same clients, Lua
scripts included, with WAIT for the replica before a protected write counts."""

from __future__ import annotations

import pytest
import redis
from support.polling import wait_for

from celery_app.factory import create_app
from celery_app.publish import TaskMessage, make_publisher
from celery_app.redis import replication
from celery_app.redis.client import get_redis
from celery_app.redis.scripts import run_script
from celery_app.redis.sentinel import SentinelUrlError, kombu_url, parse_sentinel_url
from celery_app.settings import SettingsError, load_settings


def test_the_kombu_form_parses_with_the_database_at_the_end():
    parsed = parse_sentinel_url("sentinel://:pw@h1:26379;sentinel://h2:26380/3")
    assert parsed.hosts == (("h1", 26379), ("h2", 26380))
    assert parsed.db == 3 and parsed.password == "pw" and parsed.username is None
    assert kombu_url("sentinel://:pw@h1:26379;sentinel://h2/3") == (
        "sentinel://:pw@h1:26379/3;sentinel://:pw@h2:26379/3"
    )


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("sentinel://h1:1;redis://h2:2", "must start with sentinel://"),
        ("sentinel://h1:1/x", "must be a number"),
        ("sentinel://h1:1/1;sentinel://h2:2/2", "different databases"),
        ("sentinel://:a@h1:1;sentinel://:b@h2:2", "different credentials"),
        ("sentinel://h1:99999", "bad port"),
    ],
)
def test_a_bad_sentinel_url_names_its_fault(url, fault):
    with pytest.raises(SentinelUrlError, match=fault):
        parse_sentinel_url(url)


def test_wait_replicas_is_bounded_and_named():
    with pytest.raises(SettingsError, match=r"CHECKBEAT_REDIS_WAIT_REPLICAS=17.*<= 16"):
        load_settings(redis_wait_replicas=17)
    with pytest.raises(SettingsError, match="CHECKBEAT_REDIS_WAIT_TIMEOUT"):
        load_settings(redis_wait_timeout=0)


def test_a_sentinel_broker_gets_kombus_master_name_and_every_address_its_db():
    settings = load_settings(
        broker_url="sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/4",
        redis_sentinel_master="cache",
        redis_sentinel_password="s3cret",
    )
    app = create_app(settings)
    options = app.conf.broker_transport_options
    assert options["master_name"] == "cache"
    assert options["sentinel_kwargs"]["password"] == "s3cret"
    assert options["visibility_timeout"] == 3600
    assert app.conf.broker_url == "sentinel://127.0.0.1:1/4;sentinel://127.0.0.1:2/4"


def test_state_and_scripts_follow_a_failover_and_waits_count_the_replica(sentinel_deployment):
    url = sentinel_deployment.url(1)
    settings = load_settings(redis_url=url, broker_url=sentinel_deployment.url(0))
    client = get_redis(url, settings)
    assert replication.wait_policy(client) == (1, 250)  # 1 replica under Sentinel by default
    before = replication.shortfalls()
    client.zadd("ha:due", {"j1": 1.0})
    assert replication.run_replicated(client, "due", ["ha:due"], ["5", 10], "test") == "j1"
    assert replication.shortfalls() == before  # the replica acknowledged
    replica = redis.Redis(port=sentinel_deployment.replica.port, db=1, decode_responses=True)
    assert replica.zscore("ha:due", "j1") == 1.0

    old_master = sentinel_deployment.master.port
    sentinel_deployment.kill_master()
    wait_for(
        lambda: sentinel_deployment.master_port_seen() == sentinel_deployment.replica.port,
        30,
        what="the Sentinels to promote the replica",
    )
    assert sentinel_deployment.replica.port != old_master

    def writes() -> bool:
        try:
            client.set("ha:after", "1")
            return True
        except redis.RedisError:
            return False

    wait_for(writes, 30, what="the same client to write to the promoted replica")
    # the same script, on a server that may not have it cached (NOSCRIPT is reloaded)
    assert run_script(client, "due", ["ha:due"], ["5", 10]) == "j1"
    assert replica.get("ha:after") == "1"
    # no replica now: the protected write goes on, counted as a shortfall; pipelined on a
    # master without the script, it is loaded and run again with its WAIT (pipelined_scripts)
    client.script_flush()
    assert replication.run_replicated(client, "due", ["ha:due"], ["5", 10], "test") == "j1"
    assert replication.shortfalls() == before + 1


def test_the_batch_publisher_pushes_to_the_master_the_sentinels_name(sentinel_deployment):
    settings = load_settings(
        redis_url=sentinel_deployment.url(1), broker_url=sentinel_deployment.url(0)
    )
    app = create_app(settings)
    publisher = make_publisher(app)
    try:
        assert publisher.fast is not None  # the LPUSH fast path, not kombu's per message
        publisher.publish([TaskMessage(name="x.y", queue="ha.q", kwargs={"a": 1})])
        master = redis.Redis(port=sentinel_deployment.master.port, db=0)
        assert master.llen("ha.q") == 1
        sentinel_deployment.kill_master()
        wait_for(
            lambda: sentinel_deployment.master_port_seen() == sentinel_deployment.replica.port,
            30,
            what="the promotion",
        )

        def published() -> bool:
            try:
                publisher.publish([TaskMessage(name="x.y", queue="ha.q", kwargs={"a": 2})])
                return True
            except redis.RedisError:
                return False

        wait_for(published, 30, what="the publisher to reach the promoted replica")
        promoted = redis.Redis(port=sentinel_deployment.replica.port, db=0)
        assert promoted.llen("ha.q") == 2  # the first (replicated) and the second
    finally:
        publisher.close()


def test_a_user_app_on_a_sentinel_broker_keeps_its_state_there_under_its_master_name(
    monkeypatch,
):
    from celery import Celery

    from celery_app.factory import install, settings_of

    monkeypatch.delenv("CHECKBEAT_REDIS_URL")  # the suite's; the app's broker decides here
    url = "sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/0"
    app = install(Celery("proj", broker=url, set_as_current=False))
    app.conf.broker_transport_options = {"master_name": "cache"}
    settings = settings_of(app)
    assert settings.redis_url == url
    assert settings.redis_sentinel_master == "cache"


def test_a_demoted_master_read_only_is_followed_to_the_promoted_one(sentinel_deployment):
    """SENTINEL FAILOVER demotes a live master: the client's pooled connections to it answer
    READONLY, which redis-py's Sentinel connection turns into a reconnect to the master the
    Sentinels name; the demoted master is then the replica WAIT counts."""
    url = sentinel_deployment.url(1)
    client = get_redis(url, load_settings(redis_url=url))
    client.set("ha:k", "before")  # a pooled connection to the old master
    old, new = sentinel_deployment.master.port, sentinel_deployment.replica.port
    with sentinel_deployment.sentinels[0].client() as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", "mymaster")
    demoted = redis.Redis(port=old, db=1, decode_responses=True)
    wait_for(lambda: demoted.info("replication")["role"] == "slave", 30, what="the demotion")
    promoted = redis.Redis(port=new, db=1, decode_responses=True)
    wait_for(lambda: promoted.info("replication")["connected_slaves"] == 1, 30, what="the resync")
    client.set("ha:k", "after")  # READONLY on the old connection, retried on the new master
    assert promoted.get("ha:k") == "after"
    before = replication.shortfalls()
    client.zadd("ha:due", {"j": 1.0})
    assert replication.run_replicated(client, "due", ["ha:due"], ["5", 10], "t") == "j"
    assert replication.shortfalls() == before  # the demoted master acknowledged as replica
    wait_for(lambda: demoted.zscore("ha:due", "j") == 1.0, 5, what="the replicated write")


def test_a_lagging_replica_is_a_shortfall_that_is_counted_and_passed(sentinel_deployment):
    """The replica stalls (DEBUG SLEEP) past the WAIT timeout: the protected write still
    happens and answers, and the shortfall is counted; the client then skips WAIT for a while
    rather than stall every write."""
    import threading

    url = sentinel_deployment.url(1)
    client = get_redis(url, load_settings(redis_url=url, redis_wait_timeout=0.1))
    assert replication.wait_policy(client) == (1, 100)
    replica = redis.Redis(port=sentinel_deployment.replica.port, socket_timeout=5)
    stall = threading.Thread(target=lambda: replica.execute_command("DEBUG", "SLEEP", "1.0"))
    client.zadd("ha:due", {"j": 1.0})
    before = replication.shortfalls()
    replica_stalled = stall_seen(sentinel_deployment.replica.port)
    stall.start()
    try:
        wait_for(replica_stalled, 2, what="the replica to stall")
        client.zadd("ha:due", {"k": 2.0})
        assert replication.run_replicated(client, "due", ["ha:due"], ["5", 10], "t") == "j\nk"
    finally:
        stall.join()
    assert replication.shortfalls() == before + 1
    pipe = client.pipeline(transaction=False)
    assert replication.queue_wait(pipe, client) == []  # skipped while degraded


def test_a_runs_start_is_on_the_replica_when_it_answers_and_dated_after_its_wait(
    sentinel_deployment,
):
    """The start read is followed by WAIT on the same round trip: the run's started marker, and
    the claim written before it, are on the replica when the read answers (no polling). Its
    time is taken after the WAIT: a lagging replica that holds the WAIT does not make the run
    plan from a time older than the answer."""
    import threading

    from celery_app.checks.start_read import read_start
    from celery_app.redis.clock import server_time
    from celery_app.redis.keyspace import state_keys
    from celery_app.redis.schema import CheckField, JobField

    url = sentinel_deployment.url(1)
    settings = load_settings(redis_url=url, redis_wait_timeout=3)
    client, keys = get_redis(url, settings), state_keys(settings)
    client.hset(keys.check("c"), mapping={CheckField.KIND: "http", CheckField.TARGET: "http://x/"})
    replica = redis.Redis(port=sentinel_deployment.replica.port, db=1, decode_responses=True)
    before = replication.shortfalls()
    for job, token in (("c@eu", "t1"), ("c@us", "t2")):
        client.hset(keys.job(job), JobField.LEASE_TOKEN, token)  # the claim
    read = read_start(client, keys, "c@eu", "c", "t1", "celery-1", 60_000)
    assert read.first_delivery
    assert replica.get(keys.run_started("c@eu", "t1")) == "celery-1"
    assert replica.hget(keys.job("c@us"), JobField.LEASE_TOKEN) == "t2"  # written before it
    assert replication.shortfalls() == before

    stall = threading.Thread(
        target=lambda: redis.Redis(
            port=sentinel_deployment.replica.port, socket_timeout=5
        ).execute_command("DEBUG", "SLEEP", "1.5")
    )
    replica_stalled = stall_seen(sentinel_deployment.replica.port)
    stall.start()
    try:
        wait_for(replica_stalled, 2, what="the replica to stall")
        asked_at = server_time(client)
        read = read_start(client, keys, "c@us", "c", "t2", "celery-2", 60_000)
    finally:
        stall.join()
    assert read.first_delivery and replication.shortfalls() == before  # acknowledged, late
    assert read.server_now - asked_at > 0.5  # the time after the WAIT, not the script's
    assert replica.get(keys.run_started("c@us", "t2")) == "celery-2"


def stall_seen(port: int):
    """Whether the server on ``port`` is stalled now (a ping gets no answer within 50 ms): a
    condition to poll while a ``DEBUG SLEEP`` holds it."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    probe = redis.Redis(port=port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))

    def stalled() -> bool:
        try:
            probe.ping()
            return False
        except redis.TimeoutError:
            return True

    return stalled
