"""Check state survives a Redis restart (AOF on): region states, the check's state, its
transitions and the undelivered outbox come back, and the next run continues from them."""

from __future__ import annotations

import time
from pathlib import Path

import redis
from support.health import run_once

from celery_app.checks.jobs import read_job
from celery_app.checks.kinds import check_kind, unregister_kind
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CheckStateField
from celery_app.settings import load_settings


def test_state_and_undelivered_transitions_survive_a_restart(tmp_path: Path):
    check_kind("restartprobe")(lambda target, config: True)
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), regions=["eu", "us"]
        )
        keys = state_keys(settings)
        client = redis.Redis.from_url(server.url(1), decode_responses=True)
        store = CheckStore(client, keys, settings)
        store.create(
            uid="c", tenant="acme", kind="restartprobe", target="x", period=60,
            regions=["eu", "us"], failure_threshold=2, success_threshold=2, quorum=1,
        )  # fmt: skip
        now = time.time()
        run_once(client, keys, settings, store.params, "c@eu", False, now)
        assert run_once(client, keys, settings, store.params, "c@eu", False, now + 1)[1] == "c#1"
        run_once(client, keys, settings, store.params, "c@eu", True, now + 2)  # 1 of 2 successes
        client.close()
        server.restart()
        client = redis.Redis.from_url(server.url(1), decode_responses=True)
        store = CheckStore(client, keys, settings)
        health = read_job(client, keys, "c@eu").health
        assert (health.state, health.streak_state, health.streak) == ("down", "up", 1)
        assert client.hget(keys.check_state("c"), CheckStateField.STATE) == "down"
        assert client.zrange(keys.of_check("c").transition_outbox(), 0, -1) == ["c#1"]
        assert client.xlen(keys.check_transitions("c")) == 1
        # the streak continues: the second success in a row recovers
        assert run_once(client, keys, settings, store.params, "c@eu", True, now + 3)[1] == "c#2"
        client.close()
    finally:
        server.stop()
        unregister_kind("restartprobe")
