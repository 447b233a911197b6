"""Lane topology: ``celery worker --role fast|shared`` consumes the right queues with the right
slots and keeps its capacity registered in Redis while it lives (real worker subprocesses)."""

from __future__ import annotations

import os
import threading
import warnings

import pytest
import redis
from support.partitions import suite_keys
from support.polling import wait_for

from celery_app.settings import load_settings
from workers.roles import (
    CapacityRegistration,
    RoleError,
    WorkerRole,
    plan_role,
    role_from_queues,
    slots_known_live,
)

KEYS = suite_keys("cbtest")
ENV = {
    "CHECKBEAT_REGIONS": "eu,us",
    "CHECKBEAT_POOL_SIZE": "5",
    "CHECKBEAT_FAST_LANE_RESERVED": "2",
}


def test_role_plans_follow_the_pool_settings():
    settings = load_settings(regions=["eu", "us"], pool_size=8, fast_lane_reserved=2)
    fast = plan_role("fast", None, settings)
    assert (fast.region, fast.queues, fast.concurrency) == ("eu", ("checks.eu.fast",), 2)
    shared = plan_role("shared", "us", settings)
    assert shared.queues == ("checks.us.fast", "checks.us.slow")
    assert shared.concurrency == 6


@pytest.mark.parametrize(
    ("role", "region", "overrides", "message"),
    [
        ("medium", None, {}, "--role must be one of fast, shared"),
        ("fast", "mars", {}, "--region 'mars' is not in CHECKBEAT_REGIONS"),
        ("fast", None, {"fast_lane_reserved": 0}, "run only the shared role"),
    ],
)
def test_bad_roles_say_what_is_allowed(role, region, overrides, message):
    with pytest.raises(RoleError, match=message):
        plan_role(role, region, load_settings(**overrides))


def test_plain_workers_get_a_role_only_from_check_queues():
    assert role_from_queues(["celery", "cron"], 4) is None
    fast = role_from_queues(["celery", "checks.eu.fast"], 3)
    assert (fast.role, fast.region, fast.queues, fast.concurrency) == (
        "fast",
        "eu",
        ("checks.eu.fast",),
        3,
    )
    assert role_from_queues(["checks.eu.slow", "checks.eu.fast"], 6).role == "shared"
    with pytest.raises(RoleError, match="one region only"):
        role_from_queues(["checks.eu.fast", "checks.us.fast"], 2)


def registration(r, hostname):
    """The worker's hash as one partition holds it, with its slots summed over the partitions
    of the check half (each holds its share): {} until every partition holds it."""
    hashes = [r.hgetall(part.worker(hostname)) for part in KEYS.every_partition()]
    if not all(hashes):
        return {}
    return hashes[0] | {"concurrency": str(sum(int(h["concurrency"]) for h in hashes))}


def registered_anywhere(r, hostname) -> bool:
    return any(r.exists(part.worker(hostname)) for part in KEYS.every_partition())


def test_role_workers_register_capacity_and_unregister_on_warm_shutdown(r, start_worker_process):
    fast = start_worker_process("--role", "fast", "-P", "threads", "-n", "fast@t", **ENV)
    shared = start_worker_process(
        "--role", "shared", "--region", "us", "-P", "threads", "-n", "shared@t", **ENV
    )
    cron = start_worker_process("-Q", "celery", "-P", "threads", "-c", "3", "-n", "cron@t", **ENV)
    start_worker_process(
        "-Q", "checks.eu.slow,checks.eu.fast", "-P", "threads", "-c", "4", "-n", "plain@t", **ENV
    )
    wait_for(lambda: registration(r, "fast@t"), 30, what="fast worker registration")
    wait_for(lambda: registration(r, "shared@t"), 30, what="shared worker registration")
    wait_for(lambda: registration(r, "plain@t"), 30, what="plain check worker registration")
    wait_for(lambda: "ready" in cron.output(), 30, what="cron worker ready")

    got = registration(r, "fast@t")
    assert (got["role"], got["region"], got["queues"], got["concurrency"]) == (
        "fast",
        "eu",
        "checks.eu.fast",
        "2",
    )
    got = registration(r, "shared@t")
    assert (got["role"], got["region"], got["queues"], got["concurrency"]) == (
        "shared",
        "us",
        "checks.us.fast,checks.us.slow",
        "3",
    )
    got = registration(r, "plain@t")
    assert (got["role"], got["queues"], got["concurrency"]) == (
        "shared",
        "checks.eu.fast,checks.eu.slow",
        "4",
    )
    assert 0 < r.ttl(KEYS.worker("fast@t")) <= 15
    assert r.smembers(KEYS.region_workers("eu")) == {"fast@t", "plain@t"}
    assert r.smembers(KEYS.region_workers("us")) == {"shared@t"}
    assert not registered_anywhere(r, "cron@t")  # a cron worker registers no probe capacity
    # The worker really consumes what it registered (celery prints its queues at start).
    assert "checks.us.slow" in shared.output() and "concurrency: 3 (thread)" in shared.output()

    assert fast.stop() == 0
    assert not registered_anywhere(r, "fast@t")
    assert r.smembers(KEYS.region_workers("eu")) == {"plain@t"}


def test_a_role_with_explicit_queues_is_refused(r, start_worker_process):
    worker = start_worker_process("--role", "fast", "-Q", "celery", "-n", "bad@t", **ENV)
    assert worker.process.wait(30) != 0
    assert "--role sets the queues itself" in worker.output()
    assert not registered_anywhere(r, "bad@t")


@pytest.mark.parametrize("how", ["role", "queues"])
def test_check_queues_are_consumed_without_acks(r, broker, broker_url, start_worker_process, how):
    """The lease is a check run's delivery guarantee (``worker_step.consume_without_acks``):
    kombu keeps no unacked copy of a run message (that its ack sends nothing is
    tests/test_kombu_redis.py's). Here every message is rejected (unknown jobs), by a role
    worker and by a plain worker given the check queues with -Q."""
    from celery import Celery

    from celery_app.checks.run_contract import RUN_CHECK_TASK, run_kwargs

    args = ["--role", "shared"] if how == "role" else ["-Q", "checks.eu.fast,checks.eu.slow"]
    worker = start_worker_process(*args, "-P", "threads", "-c", "2", "-n", "noack@t", **ENV)
    wait_for(lambda: registration(r, "noack@t"), 30, what="the worker's registration")
    unacked_writes: list[str] = []
    watching = threading.Event()
    monitor = threading.Thread(
        target=_watch_unacked, args=(broker_url, unacked_writes, watching), daemon=True
    )
    monitor.start()
    assert watching.wait(10)
    try:
        sender = Celery("sender", broker=broker_url)
        for n, lane in enumerate(("fast", "slow", "fast")):
            kwargs = run_kwargs(f"ghost{n}@eu", f"t{n}", 1.0, 1.0, 1.0)
            sender.send_task(RUN_CHECK_TASK, kwargs=kwargs, queue=f"checks.eu.{lane}")
        wait_for(
            lambda: worker.output().count("rejected run_check") == 3,
            30,
            what=f"three rejections\n{worker.output()[-3000:]}",
        )
    finally:
        broker.set("stop-watching", "1")  # the monitor's last command: it stops there
        monitor.join(10)
    assert not monitor.is_alive()  # it saw every command up to the marker
    assert unacked_writes == []
    assert broker.hlen("unacked") == 0 and broker.zcard("unacked_index") == 0


def _watch_unacked(broker_url: str, seen: list[str], watching: threading.Event) -> None:
    """Every broker command that records or removes a delivery in kombu's unacked hash or
    index (not its periodic restore of old ones), until ``stop-watching``."""
    client = redis.Redis.from_url(broker_url, decode_responses=True)
    with client.monitor() as monitor:  # MONITOR answered: every later command is seen
        watching.set()
        for command in monitor.listen():
            text = command["command"]
            if text.startswith(("HSET unacked ", "ZADD unacked_index ", "HDEL unacked ",
                                "ZREM unacked_index ")):  # fmt: skip
                seen.append(text)
            if "stop-watching" in text:
                return


@pytest.mark.parametrize(("how", "slots"), [("role", 3), ("queues", 2)])
def test_a_check_worker_without_acks_fetches_only_into_free_slots(
    r, broker, broker_url, make_app, start_worker_process, target, claim, how, slots
):
    """Without acks kombu's prefetch limit counts nothing, so a check worker fetches only into
    free slots (``worker_disable_prefetch``), a role worker and a plain -Q one alike: while its
    slots run 3 s probes, the other runs wait in the broker, and then they all run."""
    from celery import Celery

    from celery_app.checks.jobs import read_job
    from celery_app.checks.run_contract import RUN_CHECK_TASK
    from celery_app.checks.store import CheckStore
    from celery_app.redis.schema import check_queue, job_id

    app = make_app(regions=["eu", "us"], allow_private_targets=True)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    slow = target.url("/delay/3000")
    runs = slots + 3
    messages = []
    for n in range(runs):
        store.create(uid=f"s{n}", tenant="t", kind="http", target=slow, period=3600,
                     regions=["eu"])  # fmt: skip
        job = job_id(f"s{n}", "eu")
        queue = check_queue("eu", read_job(r, KEYS, job).lane)
        messages.append((claim(r, KEYS, job, f"tok{n}"), queue))
    args = ["--role", "shared"] if how == "role" else ["-Q", "checks.eu.fast,checks.eu.slow"]
    start_worker_process(
        *args, "-P", "threads", "-c", str(slots), "-n", "slots@t",
        CHECKBEAT_ALLOW_PRIVATE_TARGETS="1", **ENV,
    )  # fmt: skip
    wait_for(lambda: registration(r, "slots@t"), 30, what="the worker's registration")
    sender = Celery("sender", broker=broker_url)
    for kwargs, queue in messages:
        sender.send_task(RUN_CHECK_TASK, kwargs=kwargs, queue=queue)

    def queued() -> int:
        return broker.llen("checks.eu.fast") + broker.llen("checks.eu.slow")

    wait_for(lambda: target.hits("/delay/3000") == slots, 30, what="the slots to fill")
    assert queued() == runs - slots  # the rest was not fetched into memory
    wait_for(lambda: target.hits("/delay/3000") == runs, 60, what="every run")
    assert queued() == 0


def _in_a_forked_child(probe):
    """``probe()`` run in a child forked from this process (as a prefork pool's are), returned."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # fork with threads running: the child only reads a dict
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.write(write, repr(probe()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        return answer.read()


def test_the_registering_process_knows_whether_its_slots_are_live(r):
    """A completion hands its freed slot off only when the slot is live: the process keeping
    the registration says so without Redis; a forked child, whose parent registers, and any
    process after the warm shutdown's stop do not know (None: read the hash)."""
    stuck = [0]
    role = WorkerRole("shared", "eu", ("checks.eu.fast", "checks.eu.slow"), 4)
    registration = CapacityRegistration(r, KEYS, "live@test", role, stuck=lambda: stuck[0])
    assert slots_known_live("live@test") is None
    registration.start()
    try:
        assert r.exists(KEYS.of_job("c1@eu").worker("live@test"))
        assert slots_known_live("live@test") is True
        assert slots_known_live("other@test") is None
        stuck[0] = 1
        assert slots_known_live("live@test") is False
        stuck[0] = 0
        assert _in_a_forked_child(lambda: slots_known_live("live@test")) == "None"
    finally:
        registration.stop()
    assert slots_known_live("live@test") is None
    assert not r.exists(KEYS.of_job("c1@eu").worker("live@test"))
