"""The dispatcher on a real Redis: WFQ claim order, lanes and capacity, atomic claims, reaping."""

from __future__ import annotations

import json
import threading

import pytest
from support.checks import RECORD_KEYS, at, learned, register_fake_worker
from support.completion import finish, write
from support.partitions import dispatchers, pinned, tick_all

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import CompletedRun, read_job
from celery_app.checks.run_contract import RUN_CHECK_TASK, RunRequest, RunStatus
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.findings import FindingKind
from celery_app.redis.schema import check_queue
from celery_app.settings import load_settings
from scheduling_core import PostExecState

T0 = 1_780_000_000.0


def make_checks(
    store: CheckStore, n: int, *, region: str = "eu", prefix: str = "c", spread: bool = False, **kw
) -> list[str]:
    """Create ``n`` checks and return their uids: ``c000``, ``c001``... moved to the first
    partition of the check half (so a test reads one partition's order, slots and indexes), or
    left where their uid puts them (``spread``)."""
    names = [f"{prefix}{i:03d}" for i in range(n)]
    uids = names if spread else [pinned(store.keys, name) for name in names]
    for uid in uids:
        store.create(
            now=at(T0 - 100),
            uid=uid,
            tenant=kw.get("tenant", "acme"),
            kind="testprobe",
            target="x",
            period=kw.get("period", 60),
            regions=[region],
            plan_weight=kw.get("plan_weight", 0),
        )
    return uids


def claimed_ids(report) -> list[str]:
    return [c.job_id for c in report.claims]


@pytest.fixture
def tiered(redis_url, broker_url):
    return load_settings(
        redis_url=redis_url,
        broker_url=broker_url,
        key_prefix="cbtest",
        regions=["eu", "us", "ap"],
        tier_credit_per_weight=5,
        tier_credit_max=20,
    )


@pytest.fixture
def tiered_store(r, keys, tiered, test_kind):
    return CheckStore(r, keys, tiered)


def test_claims_follow_effective_deadline_order_when_slots_are_short(
    r, keys, store, dispatcher_app, broker
):
    u = make_checks(store, 6)
    costs = {u[0]: 900.0, u[1]: 0.0, u[2]: 300.0, u[3]: 50.0, u[4]: 2000.0}
    for uid, cost in costs.items():
        learned(r, keys, store.params, f"{uid}@eu", scheduled_at=T0, cost_ms=cost)
    # c005 became due 31 s ago and is cheap: it sorts first anyway
    learned(r, keys, store.params, f"{u[5]}@eu", scheduled_at=T0 - 31, cost_ms=14000.0, lane=0)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=3)
    d = Dispatcher(dispatcher_app, client=r)
    report = d.tick(T0 + 0.5)
    assert report.promoted == 6
    # 31 s overdue beats any on-time job, even with the maximum (30 s) cost offset
    assert claimed_ids(report) == [f"{u[5]}@eu", f"{u[1]}@eu", f"{u[3]}@eu"]
    assert report.slots["eu"].total == 3
    # no free slot: nothing more is claimed; the rest waits in the ready index in order
    assert claimed_ids(d.tick(T0 + 1)) == []
    assert r.zrange(keys.ready("eu", 0), 0, -1) == [f"{u[2]}@eu", f"{u[0]}@eu", f"{u[4]}@eu"]


def test_tier_credit_pulls_a_paid_job_ahead(r, keys, tiered, tiered_store, broker):
    from celery_app.factory import create_app

    u = make_checks(tiered_store, 3)
    tiered_store.update(u[2], plan_weight=2)  # 10 s of credit
    for uid in (u[0], u[1]):
        learned(r, keys, tiered_store.params, f"{uid}@eu", scheduled_at=T0 - 5)
    learned(r, keys, tiered_store.params, f"{u[2]}@eu", scheduled_at=T0, plan_weight=2)
    register_fake_worker(r, keys, "w1", region="eu", role="shared", concurrency=1)
    report = Dispatcher(create_app(tiered), client=r).tick(T0 + 1)
    assert claimed_ids(report) == [f"{u[2]}@eu"]


def test_with_spare_slots_everything_due_is_claimed_at_once(r, keys, store, dispatcher_app, broker):
    """Over every partition: the checks spread, one dispatcher each, a worker in each."""
    u = make_checks(store, 30, spread=True)
    for i in range(30):
        learned(
            r,
            keys,
            store.params,
            f"{u[i]}@eu",
            scheduled_at=T0 + i % 3,
            cost_ms=2000.0 if i % 2 else 10.0,
            lane=i % 2,
        )
    for part in keys.every_partition():
        register_fake_worker(r, part, "fast", region="eu", role="fast", concurrency=10)
        register_fake_worker(r, part, "shared", region="eu", role="shared", concurrency=40)
    report = tick_all(dispatchers(dispatcher_app, r), T0 + 5)
    assert sorted(claimed_ids(report)) == [f"{uid}@eu" for uid in u]
    assert broker.llen(check_queue("eu", "fast")) == 15
    assert broker.llen(check_queue("eu", "slow")) == 15
    assert sum(r.zcard(part.due()) for part in keys.every_partition()) == 0


def test_lanes_never_exceed_free_slots_and_slow_never_takes_reserved(
    r, keys, store, dispatcher_app, broker
):
    u = make_checks(store, 40)
    for i in range(40):
        slow = i < 20
        learned(
            r,
            keys,
            store.params,
            f"{u[i]}@eu",
            scheduled_at=T0 - (30 if slow else 0),
            cost_ms=3000.0 if slow else 50.0,
            lane=1 if slow else 0,
        )
    register_fake_worker(r, keys, "fast", region="eu", role="fast", concurrency=2)
    register_fake_worker(r, keys, "shared", region="eu", role="shared", concurrency=6)
    d = Dispatcher(dispatcher_app, client=r)
    # slow jobs are 30 s older and would win every slot if lanes did not cap them
    report = d.tick(T0 + 1)
    lanes = [c.lane for c in report.claims]
    assert lanes.count(1) == 6 and lanes.count(0) == 2
    for _ in range(3):
        d.tick(T0 + 2)
        queued_or_running = r.zcard(keys.leases("eu", 0)) + r.zcard(keys.leases("eu", 1))
        assert queued_or_running <= 8
        assert broker.llen(check_queue("eu", "slow")) + 0 <= 6
        assert broker.llen(check_queue("eu", "fast")) + broker.llen(check_queue("eu", "slow")) <= 8
    # finishing two slow runs frees two shared slots: fast jobs may take them
    for claim in [c for c in report.claims if c.lane == 1][:2]:
        job = read_job(r, keys, claim.job_id)
        state = PostExecState(3000.0, 0.0, at(T0 + 120), 1)
        run = CompletedRun(claim.job_id, claim.lease_token, state, at(T0 + 60))
        assert write(r, keys, [run]) == [True]
    later = d.tick(T0 + 3)
    assert len(later.claims) == 2
    assert job is not None


def test_only_fast_workers_means_slow_jobs_wait(r, keys, store, dispatcher_app, broker):
    u = make_checks(store, 4)
    for i in range(4):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0, cost_ms=3000.0, lane=1)
    register_fake_worker(r, keys, "fast", region="eu", role="fast", concurrency=8)
    assert Dispatcher(dispatcher_app, client=r).tick(T0 + 1).claims == ()


def test_no_live_worker_claims_nothing_and_diagnose_says_so(r, keys, store, dispatcher_app, broker):
    from celery_app.checks.capacity import diagnose_regions

    u = make_checks(store, 3)
    for i in range(3):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0)
    r.sadd(keys.region_workers("eu"), "gone-worker")  # heartbeat key expired long ago
    report = Dispatcher(dispatcher_app, client=r).tick(T0 + 1)
    assert report.claims == () and report.slots["eu"].total == 0
    assert not r.sismember(keys.region_workers("eu"), "gone-worker")  # pruned
    problems = diagnose_regions(r, keys, ["eu", "us"])
    assert {(p.kind, p.subject) for p in problems} == {
        (FindingKind.NO_LIVE_WORKER, "eu"),
        (FindingKind.NO_LIVE_WORKER, "us"),
    }
    assert "3 due job(s)" in next(p.message for p in problems if p.subject == "eu")


def test_published_message_carries_the_claim_and_time_limits(
    r, keys, store, dispatcher_app, broker
):
    import base64

    u = make_checks(store, 1)
    learned(r, keys, store.params, f"{u[0]}@eu", scheduled_at=T0, cost_ms=400.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    (claim,) = Dispatcher(dispatcher_app, client=r).tick(T0 + 1).claims
    raw = json.loads(broker.lpop(check_queue("eu", "fast")))
    assert raw["headers"]["task"] == RUN_CHECK_TASK
    # Celery's limits include the dispatch lead: a run claimed ahead waits for its tick first.
    lead = settings_of(dispatcher_app).dispatch_lead
    assert raw["headers"]["timelimit"] == pytest.approx([17.0 + lead, 15.0 + lead])
    _args, kwargs, _ = json.loads(base64.b64decode(raw["body"]))
    msg = RunRequest.parse(kwargs, max_timeout_s=17.0)
    assert kwargs == msg.kwargs()  # the wire form is exactly the request, nothing else
    assert msg.job_id == f"{u[0]}@eu" and msg.lease_token == claim.lease_token
    assert msg.scheduled_at == pytest.approx(T0) and msg.timeout_s == 15.0
    job = read_job(r, keys, f"{u[0]}@eu")
    assert job.lease_token == claim.lease_token
    assert job.lease_expiry == pytest.approx(T0 + 1 + 15 + 2 + 5)


def test_two_dispatchers_claim_disjoint_sets(r, keys, store, dispatcher_app, broker):
    u = make_checks(store, 200)
    for i in range(200):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0 + (i % 10) * 0.1)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=150)
    dispatchers = [Dispatcher(dispatcher_app) for _ in range(2)]
    results: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def run(k: int) -> None:
        for step in range(20):
            barrier.wait(timeout=30)  # both tick the same instant, racing for the same jobs
            results[k].extend(claimed_ids(dispatchers[k].tick(T0 + step * 0.1)))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    both = results[0] + results[1]
    assert len(both) == len(set(both)) == 150  # disjoint, and never past the free slots
    assert r.zcard(keys.leases("eu", 0)) == 150
    assert r.zcard(keys.ready("eu", 0)) == 50


def test_expired_lease_is_reaped_once_as_a_lost_timed_out_run(
    r, keys, store, dispatcher_app, broker
):
    u = make_checks(store, 1)
    learned(r, keys, store.params, f"{u[0]}@eu", scheduled_at=T0, cost_ms=100.0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    d1, d2 = Dispatcher(dispatcher_app, client=r), Dispatcher(dispatcher_app, client=r)
    (claim,) = d1.tick(T0 + 1).claims
    assert d1.tick(T0 + 10).reaped == 0  # still within its lease
    expired = T0 + 1 + d1.lease_s + 0.5
    reaped = d1.reap(expired) + d2.reap(expired) + d2.tick(expired + 1).reaped
    assert reaped == 1
    job = read_job(r, keys, f"{u[0]}@eu")
    assert job.lease_token is None and job.runs == 2  # the setup run + the reaped one
    assert job.cost_ewma_ms == pytest.approx(0.3 * 15000 + 0.7 * 100)  # pinned to the ceiling
    assert job.scheduled_at > expired
    assert r.zscore(keys.due(), f"{u[0]}@eu") == pytest.approx(job.scheduled_at)
    last = json.loads(r.hget(keys.last_result(u[0]), "eu"))
    assert last["status"] == RunStatus.LOST and set(last) == RECORD_KEYS  # the workers' shape
    assert (last["lane"], last["error_class"], last["timed_out"]) == ("fast", "lost", True)
    # the worker finishing late is discarded: its token was reaped
    state = PostExecState(100.0, 0.0, at(T0 + 60), 0)
    late = CompletedRun(f"{u[0]}@eu", claim.lease_token, state, at(T0 + 60))
    assert write(r, keys, [late]) == [False]


def test_deleted_check_is_never_claimed(r, keys, store, dispatcher_app, broker):
    u = make_checks(store, 2)
    for i in range(2):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0)
    d = Dispatcher(dispatcher_app, client=r)
    assert d.tick(T0 + 1).claims == ()  # no worker yet: promoted, waiting for a slot
    assert len(r.zrange(keys.ready("eu", 0), 0, -1)) == 2
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=4)
    store.delete(u[0])
    assert claimed_ids(d.tick(T0 + 1)) == [f"{u[1]}@eu"]


def test_beat_runs_the_dispatcher_as_a_driver(dispatcher_app, settings, keys):
    """One dispatcher per partition of the check half (one, without partitions)."""
    from beat.scheduler import build_drivers

    drivers = build_drivers(dispatcher_app)
    found = [d for d in drivers if isinstance(d, Dispatcher)]
    assert [d.keys.partition for d in found] == list(range(keys.partitions))
    assert [d.keys for d in found] == [d.keys for d in dispatchers(dispatcher_app)]
    for each in found:
        assert each.interval == settings.dispatch_interval == 0.5
        assert each.regions == ("eu", "us", "ap")


def test_publish_failure_gives_the_claims_back(r, keys, store, dispatcher_app, broker):
    import redis as redis_lib

    from celery_app.local.embedded_redis import free_port
    from celery_app.publish import RedisBatchPublisher

    u = make_checks(store, 3)
    for i in range(3):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=3)
    dead_broker = RedisBatchPublisher(f"redis://127.0.0.1:{free_port()}/0")
    d = Dispatcher(dispatcher_app, client=r, publisher=dead_broker)
    with pytest.raises(redis_lib.ConnectionError):
        d.tick(T0 + 1)
    # nothing is leased, nothing was penalized: the jobs wait in order for the next tick
    assert r.zcard(keys.leases("eu", 0)) == 0
    assert r.zrange(keys.ready("eu", 0), 0, -1) == [f"{u[0]}@eu", f"{u[1]}@eu", f"{u[2]}@eu"]
    assert all(read_job(r, keys, f"{u[i]}@eu").lease_token is None for i in range(3))
    assert len(Dispatcher(dispatcher_app, client=r).tick(T0 + 2).claims) == 3


def test_a_finished_run_refills_its_slot_without_waiting_for_a_tick(
    r, keys, store, dispatcher_app, broker
):
    from celery_app.checks.dispatch import refill_after_run

    u = make_checks(store, 3)
    for i in range(3):
        learned(r, keys, store.params, f"{u[i]}@eu", scheduled_at=T0 + i * 0.01)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=1)
    (first,) = Dispatcher(dispatcher_app, client=r).tick(T0 + 1).claims
    assert refill_after_run(dispatcher_app, "eu", T0 + 1.01) == 0  # the slot is still busy
    assert finish(
        r,
        keys,
        store.settings,
        first.job_id,
        first.lease_token,
        params=store.params,
        duration_ms=40.0,
        exec_start=at(T0 + 1),
        now=at(T0 + 1.04),
    )[0]
    assert refill_after_run(dispatcher_app, "eu", T0 + 1.04) == 1
    assert r.zrange(keys.leases("eu", 0), 0, -1) == [f"{u[1]}@eu"]
    assert broker.llen(check_queue("eu", "fast")) == 2


def test_a_check_disabled_between_claim_and_a_failed_publish_is_not_put_back(
    r, keys, store, dispatcher_app, broker
):
    u = make_checks(store, 1)
    learned(r, keys, store.params, f"{u[0]}@eu", scheduled_at=T0)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=2)

    class DisabledThenDown:
        """A broker that is down, and the check disabled while the tick published to it."""

        def __init__(self) -> None:
            self.sent: list[str] = []

        def publish(self, messages):
            self.sent += [m.kwargs["job_id"] for m in messages]
            store.set_enabled(u[0], False, now=at(T0 + 1))
            raise ConnectionError("the broker is down")

    broker_down = DisabledThenDown()
    d = Dispatcher(dispatcher_app, client=r, publisher=broker_down)
    with pytest.raises(ConnectionError):
        d.tick(T0 + 1)  # its failed publish releases the claims
    assert broker_down.sent == [f"{u[0]}@eu"]
    assert read_job(r, keys, f"{u[0]}@eu").lease_token is None
    assert r.zcard(keys.leases("eu", 0)) == 0
    assert r.zrange(keys.ready("eu", 0), 0, -1) == []
    assert r.zrange(keys.due(), 0, -1) == []
    assert claimed_ids(d.tick(T0 + 2)) == []
