"""checkbeat's state on a three-master Redis Cluster (``redis+cluster://``), the broker on a
separate plain redis-server: checks created through the store API are dispatched, run against a
127.0.0.1 HTTP target and completed by real lane workers; a minutely cron task fires exactly once
per window from two real beats on the test clock; every key of the check half sits in one slot,
every key of the cron half in another, each on the node that owns it.

The cron witness (which window ran) goes to the session's own Redis, outside the deployment.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis
from fault_procs import Processes, ahead_clock, clocked_env
from ha_kinds import WITNESS_ENV, cron_runs
from redis.crc import key_slot
from support.partitions import count_in
from support.polling import wait_for

from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.registration import GLOBAL_TENANT
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import (
    CHECKS_TAG,
    CRON_TAG,
    CheckStateField,
    JobField,
    partition_tags,
)
from celery_app.settings import load_settings

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
CHECKS = 12
WITNESS_DB = 3
#: A simulated minute is 6 real seconds; 20 simulated seconds of grace are 2 real ones.
RATE, GRACE_S = 10.0, 20
CRON_TASK = "clusterminute"
WINDOWS = 3

CRON_TASKS = f"""
from celery_app import cron
from ha_kinds import witness_cron_run


@cron("* * * * *", id={CRON_TASK!r}, name="clustertest.minute", bind=True)
def minute(self):
    witness_cron_run({CRON_TASK!r}, self.request.cron_window)
"""


def test_state_on_a_redis_cluster_runs_checks_and_fires_cron_once_per_window(
    tmp_path, redis_cluster, redis_server, target
):
    import workers.probes  # noqa: F401 - the http kind, in this process too (the store validates)

    witness = redis.Redis.from_url(redis_server.url(WITNESS_DB), decode_responses=True)
    witness.flushdb()
    state_url, broker_url = redis_cluster.url(), redis_cluster.broker_url()
    env = clocked_env(
        tmp_path, ahead_clock(RATE), "cluster_tasks", CRON_TASKS, imports=("ha_kinds",),
        extra_paths=(HERE,),
        CHECKBEAT_REDIS_URL=state_url,
        CHECKBEAT_BROKER_URL=broker_url,
        CHECKBEAT_CRON_GRACE=str(GRACE_S),
        CHECKBEAT_ALLOWED_TARGET_ADDRESSES="127.0.0.1",
        CHECKBEAT_POOL_SIZE="4",
        CHECKBEAT_FAST_LANE_RESERVED="2",
        **{WITNESS_ENV: redis_server.url(WITNESS_DB)},
    )  # fmt: skip
    settings = load_settings(
        redis_url=state_url,
        broker_url=broker_url,
        cron_grace=GRACE_S,
        allowed_target_addresses="127.0.0.1",
    )
    keys = state_keys(settings)
    client = get_redis(state_url, settings)
    assert isinstance(client, redis.RedisCluster)
    store = CheckStore.from_settings(settings)
    uids = [f"cl{i}" for i in range(CHECKS)]
    for uid in uids:
        store.create(
            uid=uid,
            tenant=f"t{int(uid[2:]) % 3}",
            kind="http",
            target=target.url(f"/named/{uid}"),
            period=2,
        )

    # one check that fails: its first result takes it down, a transition goes through the
    # outbox to the worker that delivers it (transition_claim / _start / _finish on the cluster)
    store.create(
        uid="down", tenant="t0", kind="http", target=target.url("/status/500"), period=2,
        failure_threshold=1,
    )  # fmt: skip

    def runs(uid: str) -> int:
        return int(client.hget(keys.job(f"{uid}@local"), JobField.RUNS) or 0)

    procs = Processes(tmp_path, env)
    try:
        procs.worker("--role", "fast", "-P", "threads", "-n", "fast@cluster")
        procs.worker("--role", "shared", "-P", "threads", "-n", "shared@cluster")
        procs.worker("-Q", "celery", "-P", "threads", "-c", "2", "-n", "cron@cluster")
        for _ in range(2):
            procs.beat()
        wait_for(lambda: all(runs(uid) >= 2 for uid in uids), 90, what="every check to run twice")
        wait_for(
            lambda: len({r["window"] for r in cron_runs(witness)}) >= WINDOWS,
            90,
            what=f"{WINDOWS} cron windows",
        )
        wait_for(
            lambda: (
                client.xlen(keys.check_transitions("down")) >= 1
                and count_in(client, keys, lambda k: k.transition_outbox()) == 0
            ),
            60,
            what="the down check's transition recorded and delivered",
        )
        for proc in procs.started:
            assert proc.alive(), proc.output()[-3000:]
    finally:
        procs.stop_all()

    # checks: dispatched, run against the target, completed (a result recorded per run)
    for uid in uids:
        assert client.xlen(keys.results(uid)) >= 2, uid
        assert client.hget(keys.last_result(uid), "local"), uid
        assert target.hits(f"/named/{uid}") >= 2, uid
    assert client.hget(keys.check_state("down"), CheckStateField.STATE) == "down"
    # cron: once per window from two beats
    per_window = Counter(r["window"] for r in cron_runs(witness))
    assert len(per_window) >= WINDOWS
    assert set(per_window.values()) == {1}, per_window

    # the two halves, each in its slot (the check half: one per partition), on the node that
    # owns it
    cron_slot = key_slot(CRON_TAG.encode())
    halves = {tag: key_slot(tag.encode()) for tag in partition_tags(keys.partitions)}
    assert keys.partitions > 1 or set(halves) == {CHECKS_TAG}
    assert cron_slot not in halves.values()
    halves[CRON_TAG] = cron_slot
    # the partition count (Keys.check_layout) is found under the one-partition head by any count
    halves.setdefault(CHECKS_TAG, key_slot(CHECKS_TAG.encode()))
    written = sorted(client.scan_iter(match=f"{settings.key_prefix}:*", count=1000))
    seen: Counter[str] = Counter()
    for key in written:
        (tag,) = [t for t in halves if key.startswith(f"{settings.key_prefix}:{t}:")] or [key]
        assert tag in halves, key
        assert key_slot(key.encode()) == halves[tag], key
        assert tag != CHECKS_TAG or keys.partitions == 1 or key == keys.check_layout(), key
        seen["cron" if tag == CRON_TAG else "checks"] += 1
    assert seen["checks"] > CHECKS and seen["cron"] > 0, seen
    stable: dict[str, list[str]] = {
        CRON_TAG: [keys.cron_stats(CRON_TASK), keys.cron_state(CRON_TASK, GLOBAL_TENANT)]
    }
    for uid in uids:  # each check's job and the indexes of its partition, under its tag
        home = keys.of_check(uid)
        tag = partition_tags(keys.partitions)[home.partition]
        stable.setdefault(tag, [])
        stable[tag] = sorted({*stable[tag], home.due(), home.checks(), keys.job(f"{uid}@local")})
    for tag, names in stable.items():
        owner = redis_cluster.node_of_slot(halves[tag])
        with owner.client() as direct:  # a node answers MOVED for a key of another's slot
            assert direct.exists(*names) == len(names), tag
        for node in redis_cluster.nodes:
            with node.client() as direct:
                in_slot = int(direct.cluster("COUNTKEYSINSLOT", halves[tag]))
            assert (in_slot >= len(names)) if node is owner else (in_slot == 0), (tag, node.port)
