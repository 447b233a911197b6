"""The keyspace is cluster-ready without a cluster: under ``Keys(prefix, cluster=True)`` every key
is in the slot of its half (``{checks}`` or ``{cron}``), plain names are today's byte for byte,
and every script call the code makes, from the store, the dispatcher, a real worker and the cron
path, declares KEYS that hash to one slot, the slot of its half.

The script calls are recorded by wrapping redis-py's ``Script.__call__`` and
``ScriptPipeline.queue_script`` (the two doors every ``run_script`` goes through) while the code
runs on the suite's plain Redis with the tagged names (``celery_app.redis.keyspace`` is told the
URL is a cluster); an untagged key in any script's KEYS hashes elsewhere and fails the test.
"""

from __future__ import annotations

import inspect
import time
from collections import defaultdict
from datetime import timedelta

import pytest
from redis.commands.core import Script
from redis.crc import key_slot
from support.cron import T0, make_engine, store_of
from support.polling import wait_for

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import from_unix, read_job
from celery_app.checks.ratelimit import set_rate_limit
from celery_app.checks.repair import repair
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.cron_state import FireRequest
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.cron_tasks.service import CronService
from celery_app.factory import create_app, settings_of
from celery_app.redis import keyspace, scripts
from celery_app.redis.pipelined_scripts import ScriptPipeline
from celery_app.redis.schema import CHECKS_TAG, CRON_TAG, CronStateField, Keys, check_queue
from celery_app.redis.scripts import lua_source
from celery_app.settings import load_settings
from scheduling_core import Params

CHECK_SLOT = key_slot(CHECKS_TAG.encode())
CRON_SLOT = key_slot(CRON_TAG.encode())
#: Keys methods of the cron half (every other one is the check half's).
CRON_HALF = {
    *(name for name in dir(Keys) if name.startswith("cron_")),
    "tenants",
    "beat_heartbeat",
}
#: Scripts of the cron half; every other script is the check half's.
CRON_SCRIPTS = {"cron_claim", "cron_finish", "cron_gaps", "cron_ref", "cron_start", "cron_takeover"}
#: Argument values a key may be built from, hostile ones included (a brace in a tenant name must
#: not move its key: only the first {...} of a key is its tag, and the tag comes first).
ARGS = {
    "task_id": ["t", "a{b}"],
    "tenant": ["acme", "}{x}"],
    "window": ["2026-01-01T00:00Z"],
    "fingerprint": ["0123456789ab"],
    "uid": ["u1", "{u}"],
    "job": ["u1@eu"],
    "region": ["eu"],
    "lane": [0, 1],
    "hostname": ["w@h{1}"],
    "scope": ["check:u1"],
    "transition_id": ["u1#3"],
    "lease_token": ["17.2", "{t}"],
    "phase": ["end"],
}


#: Keys methods that give another ``Keys`` (a partition's), not a key name.
NAVIGATION = {"at", "of_check", "of_job", "of_transition", "every_partition"}
#: Keys methods named by one check (a uid, a job, a transition id): in that check's partition.
OF_ONE_CHECK = {
    "check", "check_jobs", "job", "run_started", "results", "last_result", "check_state",
    "check_transitions", "transition_delivery", "notify_outcomes",
}  # fmt: skip
#: Keys methods whose keys live in the first partition whatever the Keys' partition.
FIRST_PARTITION = {"maintenance", "maintenance_scopes", "notify_targets", "notify_scopes"}
#: Keys methods whose key is where a one-partition check half keeps it, whatever the count.
LAYOUT = {"check_layout"}


def _key_methods() -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(Keys, inspect.isfunction)
        if not name.startswith("_") and name not in NAVIGATION
    ]


def _names(keys: Keys, method: str) -> list[str]:
    params = [p for p in inspect.signature(getattr(Keys, method)).parameters if p != "self"]
    combos: list[dict] = [{}]
    for param in params:
        combos = [{**c, param: v} for c in combos for v in ARGS[param]]
    return [getattr(keys, method)(**combo) for combo in combos]


def test_every_key_is_in_the_slot_of_its_half_and_plain_names_are_unchanged():
    plain, tagged = Keys("cb"), Keys("cb", cluster=True)
    assert CHECK_SLOT != CRON_SLOT
    methods = _key_methods()
    assert len(methods) > 40  # every Keys method, not a few
    for method in methods:
        tag = CRON_TAG if method in CRON_HALF else CHECKS_TAG
        slot = CRON_SLOT if method in CRON_HALF else CHECK_SLOT
        for name, old in zip(_names(tagged, method), _names(plain, method), strict=True):
            assert name.startswith(f"cb:{tag}:"), (method, name)
            assert key_slot(name.encode()) == slot, (method, name)
            assert name.replace(f"cb:{tag}:", "cb:", 1) == old, (method, name)
    assert Keys("cb").job("u@eu") == "cb:job:u@eu"  # today's names, byte for byte


def test_with_partitions_each_key_is_in_the_slot_of_its_partition_and_partitions_spread():
    keys = Keys("cb", cluster=True, partitions=12)
    slots = [key_slot(part.due().encode()) for part in keys.every_partition()]
    assert len(set(slots)) == 12
    # the tags spread evenly over the slot ranges three masters would own: four each
    assert sorted(slot * 3 // 16384 for slot in slots) == [0] * 4 + [1] * 4 + [2] * 4
    for method in _key_methods():
        if method in CRON_HALF:
            continue
        if method in LAYOUT:
            assert key_slot(keys.check_layout().encode()) == CHECK_SLOT
            continue
        for p, part in enumerate(keys.every_partition()):
            params = [x for x in inspect.signature(getattr(Keys, method)).parameters if x != "self"]
            combos: list[dict] = [{}]
            for param in params:
                combos = [{**c, param: v} for c in combos for v in ARGS[param]]
            for combo in combos:
                name = getattr(part, method)(**combo)
                if method in OF_ONE_CHECK:
                    subject = str(next(iter(combo.values())))
                    uid = subject.rpartition("@")[0] or subject.rpartition("#")[0] or subject
                    home = keys.of_check(uid).partition
                else:
                    home = 0 if method in FIRST_PARTITION else p
                assert key_slot(name.encode()) == slots[home], (method, p, name)
    # a check's jobs in every region, its state and its transitions share its partition
    uid = "web-1"
    names = [keys.check(uid), keys.job(f"{uid}@eu"), keys.job(f"{uid}@us"),
             keys.check_state(uid), keys.transition_delivery(f"{uid}#4"),
             keys.of_check(uid).due(), keys.of_job(f"{uid}@us").leases("us", 0)]  # fmt: skip
    assert len({key_slot(n.encode()) for n in names}) == 1
    # one partition: today's names
    assert Keys("cb", partitions=1).job("u@eu") == "cb:job:u@eu"


def _script_names() -> dict[str, str]:
    return {lua_source(name): name for name in scripts.script_names()}


@pytest.fixture
def tagged_calls(monkeypatch):
    """The process's ``state_keys`` give tagged names; every script call's KEYS are recorded
    (on a client, on checkbeat's pipelines and on any other pipeline)."""
    monkeypatch.setattr(keyspace, "is_cluster_url", lambda url: True)
    by_source = _script_names()
    calls: dict[str, list[list[str]]] = defaultdict(list)
    original = Script.__call__

    def recording(self, keys=None, args=None, client=None):
        name = by_source.get(self.script)
        if name is not None:  # kombu runs Lua of its own on the broker
            calls[name].append([str(k) for k in keys or []])
        return original(self, keys=keys, args=args, client=client)

    queue = ScriptPipeline.queue_script

    def queueing(self, sha, source, keys, args):
        calls[by_source[source]].append([str(k) for k in keys])
        return queue(self, sha, source, keys, args)

    direct = scripts._call_on_client

    def calling(client, name, script, keys, args):
        calls[name].append([str(k) for k in keys])
        return direct(client, name, script, keys, args)

    monkeypatch.setattr(Script, "__call__", recording)
    monkeypatch.setattr(ScriptPipeline, "queue_script", queueing)
    monkeypatch.setattr(scripts, "_call_on_client", calling)
    return calls


def _assert_one_slot(calls: dict[str, list[list[str]]]) -> None:
    for name, each in calls.items():
        slot = CRON_SLOT if name in CRON_SCRIPTS else CHECK_SLOT
        for keys in each:
            slots = {key_slot(k.encode()) for k in keys}
            assert slots == {slot}, (name, sorted(keys)[:5], slots)


def _exercise_check_half(r, settings, test_kind: str, run_worker) -> Keys:
    """Every step of the check half once: create, rate limit, dispatch and run on a real
    worker, update, disable, enable, delete, repair, a late tick (reap, promote)."""
    app = create_app(settings)
    keys = keyspace.state_keys(settings)
    assert keys.cluster
    store = CheckStore(r, keys, settings)
    now = time.time()
    for i in range(6):
        store.create(
            uid=f"s{i}",
            tenant=f"t{i % 2}",
            kind=test_kind,
            target="x",
            period=60,
            regions=["eu", "us"],
            now=from_unix(now - 70),
        )
    set_rate_limit(r, keys, "t1", per_minute=600, burst=10)
    dispatchers = [Dispatcher(app, client=r, partition=p) for p in range(keys.partitions)]
    queues = [check_queue("eu", "fast"), check_queue("eu", "slow")]
    slots = max(2, keys.partitions)  # a slot for every partition (workers.roles shares them out)
    run_worker(app, queues, slots)
    wait_for(lambda: r.scard(keys.region_workers("eu")) == 1, 20, what="registration")

    def all_ran() -> bool:
        for dispatcher in dispatchers:
            dispatcher.tick(now)
        return all(read_job(r, keys, f"s{i}@eu").runs >= 1 for i in range(6))

    wait_for(all_ran, 40, interval=0.05, what="every eu job run by the worker")
    run_worker.stop()
    store.update("s0", period=120)
    store.set_enabled("s1", False)
    store.set_enabled("s1", True)
    store.delete("s2")
    repair(r, keys, Params.from_settings(settings), from_unix(now))
    for dispatcher in dispatchers:
        dispatcher.tick(now + 3600)  # reaps nothing live, promotes the next ticks
    return keys


@pytest.mark.timeout(90)
def test_every_check_script_call_touches_one_slot(
    tagged_calls, r, settings, test_kind, broker, run_worker
):
    keys = _exercise_check_half(r, settings, test_kind, run_worker)
    if keys.partitions > 1:
        pytest.skip("the suite runs partitioned: the test below covers it")
    seen = set(tagged_calls)
    assert {"store", "due", "promote", "top", "claim", "complete"} <= seen, seen
    stray = {key for key in r.scan_iter("cbtest:*") if not key.startswith(f"cbtest:{CHECKS_TAG}:")}
    assert stray <= {keys.cron_recorders()}  # the worker's recording marker, of the cron half
    _assert_one_slot(tagged_calls)


@pytest.mark.timeout(120)
def test_partitioned_every_script_call_touches_one_slot_of_one_partition(
    tagged_calls, r, redis_url, broker_url, test_kind, broker, run_worker
):
    settings = load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=["eu", "us"],
        check_partitions=4,
    )  # fmt: skip
    keys = _exercise_check_half(r, settings, test_kind, run_worker)
    partition_slots = {key_slot(part.due().encode()) for part in keys.every_partition()}
    seen = set(tagged_calls)
    assert {"store", "due", "promote", "top", "claim", "complete"} <= seen, seen
    used = set()
    for name, each in tagged_calls.items():
        assert name not in CRON_SCRIPTS
        for call in each:
            slots = {key_slot(k.encode()) for k in call}
            assert len(slots) == 1 and slots <= partition_slots, (name, sorted(call)[:5], slots)
            used |= slots
    # the six checks spread over more than one partition, and each ran in its own
    assert len({keys.of_check(f"s{i}").partition for i in range(6)}) > 1
    assert len(used) > 1


@pytest.mark.timeout(60)
def test_every_cron_script_call_touches_one_slot(tagged_calls, cron_app, r, run_worker):
    ran: list[str] = []

    @cron("* * * * *", app=cron_app, id="slots", name="slots.task")
    def task():
        ran.append("x")

    assert settings_of(cron_app).key_prefix
    req = FireRequest(cron_tasks(cron_app)["slots"], GLOBAL_TENANT, T0)
    store = store_of(cron_app)
    assert store.keys.cluster
    store.claim([req], now=T0, owner="beat:slow")  # claimed, never confirmed: taken over
    CronPublisher(cron_app, settings_of(cron_app).cron_grace).publish([req])
    make_engine(cron_app, owner="engine-2").take_over(T0 + timedelta(seconds=30))
    run_worker(cron_app, ["celery"], 2)
    wait_for(
        lambda: (
            r.hget(store.keys.cron_state("slots", GLOBAL_TENANT), CronStateField.OUTCOME)
            == "success"
        ),
        20,
        what="the window run once",
    )
    run_worker.stop()
    gap = (req.task, T0 + timedelta(minutes=1), T0 + timedelta(minutes=5))
    assert store.record_gaps([gap], T0 + timedelta(minutes=6), "test") == 1
    CronService(cron_app, clock=lambda: T0 + timedelta(minutes=6)).diagnose()
    seen = set(tagged_calls)
    assert {"cron_claim", "cron_takeover", "cron_start", "cron_finish", "cron_gaps"} <= seen, seen
    assert ran == ["x"]
    _assert_one_slot(tagged_calls)
