"""The completion's hand-off (complete.lua, ``checks.completion.Handoff``): the slot a run frees
goes to the region's next ready job in the same call, only when the choice needs nothing a
full claim would weigh; otherwise nothing is handed and the reply says what waits."""

from __future__ import annotations

import time

import pytest
from support.capacity import register_capacity
from support.checks import at
from support.partitions import pinned, suite_partitions
from support.round_trips import command_calls
from support.workers import claim_by_hand

from celery_app.checks.claiming import promote_due
from celery_app.checks.completion import Handoff, complete_as_read
from celery_app.checks.jobs import JobState, ReadGuard, plan_completion, read_job
from celery_app.checks.ratelimit import KNOWN_LIMITED, LIMITED_REFRESH_S
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.redis.clock import server_time
from celery_app.redis.schema import JobField, WorkerField
from scheduling_core import LANE_FAST, LANE_SLOW, Params

REGION = "eu"
#: c1, c2 and c3 share the first partition of the check half, whatever the suite's count: a
#: hand-off is one partition's (its ready index, its leases, its worker share).
C1, C2, C3 = (pinned(suite_partitions(), name) for name in ("c1", "c2", "c3"))
WORKER = "w1@test"
LEASE_S = 30.0


@pytest.fixture
def checks(store, r, keys):
    """c1 leased (its run about to complete), c2 and c3 due and promoted to the ready index."""
    for uid in (C1, C2, C3):
        store.create(uid=uid, tenant="acme", kind="testprobe", target="x", period=60,
                     regions=[REGION])  # fmt: skip
    register_capacity(r, keys, WORKER, REGION, 4)
    now = server_time(r)
    for uid in (C1, C2, C3):  # their first ticks are within the period: make them due
        r.zadd(keys.due(), {f"{uid}@{REGION}": now - 1})
    return now


def lease(r, keys, uid: str, lane: int) -> None:
    r.hset(keys.job(f"{uid}@{REGION}"), JobField.LANE, str(lane))
    claim_by_hand(r, keys, f"{uid}@{REGION}", "tok-1")


def promote(r, keys, now: float) -> None:
    promote_due(r, keys, now, 100)


def measured(r, keys, uid: str) -> None:
    r.hset(keys.job(f"{uid}@{REGION}"), JobField.RUNS, "1")


def complete(
    r, keys, uid: str = C1, worker: str = WORKER, lease_lane: int | None = None, now_s=None,
    live: bool | None = None,
):  # fmt: skip
    job_id = f"{uid}@{REGION}"
    h = r.hgetall(keys.job(job_id))
    job = JobState.from_hash(job_id, h)
    now_s = server_time(r) if now_s is None else now_s
    run = plan_completion(
        Params(), job, "tok-1", now=at(now_s), duration_ms=20.0, timed_out=False,
        exec_start=at(now_s), record=RunRecord(RunStatus.UP, REGION, finished_at=now_s),
    )  # fmt: skip
    guard = ReadGuard.of(h, r.get(keys.maintenance_version()))
    handoff = Handoff(worker, REGION, LEASE_S, lease_lane, now=now_s, live=live)
    done = complete_as_read(r, keys, run, guard, handoff, results_maxlen=10)
    assert done is not None and done.written
    return handoff, done


def test_a_freed_fast_slot_goes_to_the_next_measured_fast_job(r, keys, checks):
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    measured(r, keys, C3)
    r.zadd(keys.due(), {f"{C3}@eu": checks - 5})  # c3 due first: the lower effective deadline?
    promote(r, keys, checks)
    ready = r.zrange(keys.ready(REGION, LANE_FAST), 0, -1, withscores=True)
    handoff, done = complete(r, keys)
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.job_id == ready[0][0]  # the lowest deadline first
    assert claim.lane == LANE_FAST and claim.effective_scheduled_at == ready[0][1]
    job = read_job(r, keys, claim.job_id)
    assert job.lease_token == claim.lease_token == handoff.token
    assert r.zscore(keys.leases(REGION, LANE_FAST), claim.job_id) == pytest.approx(job.lease_expiry)
    assert job.lease_expiry == pytest.approx(max(server_time(r), job.scheduled_at) + LEASE_S, 1)
    assert r.zscore(keys.ready(REGION, LANE_FAST), claim.job_id) is None
    assert r.zcard(keys.leases(REGION, LANE_FAST)) == 1  # c1's lease went, the new one came
    assert read_job(r, keys, f"{C1}@eu").lease_token is None


def test_a_fast_job_never_measured_takes_a_shared_slot_only(r, keys, checks):
    lease(r, keys, C1, LANE_FAST)
    promote(r, keys, checks)
    handoff, done = complete(r, keys)  # c2, c3 never ran: a fast slot is not theirs
    assert done.handed == "" and done.refill_needs[0][2] >= 1  # the refill finds them
    assert r.zcard(keys.ready(REGION, LANE_FAST)) == 2
    # a slot freed in the slow lane is shared: the unmeasured job runs there, in the slow lane
    lease(r, keys, C2, LANE_SLOW)
    r.zrem(keys.ready(REGION, LANE_FAST), f"{C2}@eu")
    handoff, done = complete(r, keys, C2)
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.job_id == f"{C3}@eu" and claim.lane == LANE_SLOW
    assert r.zscore(keys.leases(REGION, LANE_SLOW), f"{C3}@eu") is not None


def test_a_shared_slot_goes_to_the_lower_deadline_of_both_lanes(r, keys, checks):
    lease(r, keys, C1, LANE_SLOW)
    measured(r, keys, C2)
    r.hset(keys.job(f"{C3}@eu"), mapping={JobField.RUNS: "1", JobField.LANE: str(LANE_SLOW)})
    promote(r, keys, checks)
    fast = r.zrange(keys.ready(REGION, LANE_FAST), 0, 0, withscores=True)[0]
    slow = r.zrange(keys.ready(REGION, LANE_SLOW), 0, 0, withscores=True)[0]
    handoff, done = complete(r, keys)
    claim = handoff.claim_of(done.handed)
    first = min(fast, slow, key=lambda entry: entry[1])
    assert claim is not None and claim.job_id == first[0]
    assert claim.lane == (LANE_FAST if first is fast else LANE_SLOW)


@pytest.mark.parametrize(
    "why",
    [
        pytest.param(lambda r, k: r.delete(k.worker(WORKER)), id="worker-unregistered"),
        pytest.param(lambda r, k: r.hset(k.worker(WORKER), WorkerField.STUCK, "1"), id="stuck"),
        pytest.param(lambda r, k: r.sadd(k.held_tenants(REGION), "other"), id="tenant-held"),
        pytest.param(lambda r, k: r.sadd(k.rate_limited_tenants(), "acme"), id="rate-limited"),
        pytest.param(
            lambda r, k: r.hset(k.job(f"{C2}@eu"), JobField.LEASE_TOKEN, "x"), id="leased"
        ),
        pytest.param(lambda r, k: r.delete(k.job(f"{C2}@eu")), id="deleted"),
    ],
)
def test_nothing_is_handed_when_a_full_claim_must_weigh_it(r, keys, checks, why):
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)
    why(r, keys)
    ready = r.zrange(keys.ready(REGION, LANE_FAST), 0, -1, withscores=True)
    _handoff, done = complete(r, keys)
    assert done.handed == "" and done.refill_needs[0][2] >= 1  # the refill claims it fully
    # the candidate a fast slot popped is back, at its place and score
    assert r.zrange(keys.ready(REGION, LANE_FAST), 0, -1, withscores=True) == ready
    assert read_job(r, keys, f"{C1}@eu").lease_token is None  # the run itself is written
    assert r.zcard(keys.leases(REGION, LANE_FAST)) == 0


def test_nothing_ready_hands_nothing_and_says_what_is_due(r, keys, checks):
    lease(r, keys, C1, LANE_FAST)
    _handoff, done = complete(r, keys)
    [(_time, first_due, waiting)] = done.refill_needs
    assert done.handed == "" and waiting == 0
    assert first_due[0] in (f"{C2}@eu", f"{C3}@eu") and float(first_due[1]) < server_time(r)


@pytest.mark.parametrize("hint", [LANE_FAST, LANE_SLOW, None], ids=["right", "wrong", "none"])
def test_the_lease_goes_whatever_the_lane_its_queue_says(r, keys, checks, hint):
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)
    handoff, done = complete(r, keys, lease_lane=hint)
    claim = handoff.claim_of(done.handed)  # a fast slot was freed: c2 takes it
    assert claim is not None and claim.job_id == f"{C2}@eu" and claim.lane == LANE_FAST
    assert r.zrange(keys.leases(REGION, LANE_FAST), 0, -1) == [f"{C2}@eu"]
    assert r.zcard(keys.leases(REGION, LANE_SLOW)) == 0


def test_nothing_is_handed_from_a_shared_slot_while_a_tenant_is_held(r, keys, checks):
    """A freed shared slot looks at both ready indexes: the held tenant is what the region's
    one EXISTS counted past them."""
    lease(r, keys, C1, LANE_SLOW)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)
    r.sadd(keys.held_tenants(REGION), "other")
    _handoff, done = complete(r, keys, lease_lane=LANE_SLOW)
    assert done.handed == "" and done.refill_needs[0][2] == 2  # ready fast and the held tenant
    assert r.zcard(keys.leases(REGION, LANE_SLOW)) == 0 and r.zcard(keys.leases(REGION, 0)) == 0


def test_with_nothing_waiting_the_completion_looks_at_no_ready_index(r, keys, checks):
    """Spare capacity: the region's one EXISTS finds nothing ready or held, so the hand-off
    reads no ready index, and the refill is told so without a second look."""
    lease(r, keys, C1, LANE_SLOW)
    before = command_calls(r)
    _handoff, done = complete(r, keys, lease_lane=LANE_SLOW)
    ran = command_calls(r) - before
    assert done.handed == "" and done.refill_needs[0][2] == 0
    assert ran["exists"] == 1
    assert ran["zrange"] == 1  # the first due job, for the refill; no ready top


def test_a_hand_off_makes_its_token_without_a_round_trip_and_never_twice(r, keys, checks):
    """The handed lease's token is the worker's (a claim's first, ``<random>.1``): the
    hand-off sends no ``TIME``, and two hand-offs planned at the same instant (a restore that
    rolled everything back would plan them so) get two tokens."""
    lease(r, keys, C1, LANE_SLOW)
    measured(r, keys, C2)
    promote(r, keys, checks)
    now_s = server_time(r)
    before = command_calls(r)
    handoff, done = complete(r, keys, lease_lane=LANE_SLOW, now_s=now_s)
    ran = command_calls(r) - before
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.lease_token == handoff.token
    assert ran["time"] == 0
    assert handoff.token.endswith(".1")
    twin = Handoff(WORKER, REGION, LEASE_S, now=handoff.now)
    assert twin.token != handoff.token and twin.token == twin.token  # one per hand-off


def test_a_worker_that_knows_its_slots_live_sends_no_read_of_its_hash(r, keys, checks):
    """A worker whose registration lives in the completing process says whether its slots
    are live (``workers.roles.slots_known_live``): the hand-off then reads no worker hash, and
    goes by what the worker said, even where its hash expired (a heartbeat that failed)."""
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)
    r.delete(keys.worker(WORKER))
    before = command_calls(r)
    handoff, done = complete(r, keys, live=True)
    ran = command_calls(r) - before
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.job_id == f"{C2}@eu"
    assert ran["hmget"] == 1  # the handed job's fields only
    assert ran["zpopmin"] == 1 and ran["zrange"] == 0 and ran["zrem"] == 1  # c1's lease


def test_a_worker_that_knows_a_slot_stuck_hands_nothing_and_pops_nothing(r, keys, checks):
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)
    ready = r.zrange(keys.ready(REGION, LANE_FAST), 0, -1, withscores=True)
    before = command_calls(r)
    _handoff, done = complete(r, keys, live=False)  # its hash says live: the worker knows better
    ran = command_calls(r) - before
    assert done.handed == "" and done.refill_needs[0][2] == 1
    assert r.zrange(keys.ready(REGION, LANE_FAST), 0, -1, withscores=True) == ready
    assert ran["zpopmin"] == 0 and ran["hmget"] == 0 and ran["zadd"] == 1  # c1's next tick


def ready_for_a_hand_off(r, keys, checks) -> None:
    """c1 leased in the fast lane, c2 (measured) alone in the fast ready index."""
    lease(r, keys, C1, LANE_FAST)
    measured(r, keys, C2)
    r.zrem(keys.due(), f"{C3}@eu")
    promote(r, keys, checks)


def test_a_fresh_copy_of_the_tenants_with_a_bucket_stands_for_the_lookup(r, keys, checks):
    """The process's copy of the tenants with a bucket, read within LIMITED_REFRESH_S, is what
    the hand-off goes by: no SISMEMBER; an older copy is not used."""
    ready_for_a_hand_off(r, keys, checks)
    KNOWN_LIMITED.read(keys, {"acme"}, time.monotonic())  # Redis's set is empty
    before = command_calls(r)
    _handoff, done = complete(r, keys)
    assert done.handed == "" and (command_calls(r) - before)["sismember"] == 0
    # a copy as old as the bound: Redis is asked (acme has no bucket there), and it hands off
    KNOWN_LIMITED.read(keys, {"acme"}, time.monotonic() - LIMITED_REFRESH_S)
    lease(r, keys, C3, LANE_FAST)
    before = command_calls(r)
    handoff, done = complete(r, keys, C3)
    ran = command_calls(r) - before
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.job_id == f"{C2}@eu"
    assert ran["sismember"] == 1 and ran["smembers"] == 1  # and the copy is read again
    assert KNOWN_LIMITED.fresh(keys) == frozenset()


def test_the_copy_is_read_on_the_completions_round_trip_once_per_refresh(r, keys, checks):
    r.sadd(keys.rate_limited_tenants(), "other")
    ready_for_a_hand_off(r, keys, checks)
    assert KNOWN_LIMITED.fresh(keys) is None  # none yet: ask Redis, read it for the next
    before = command_calls(r)
    handoff, done = complete(r, keys)
    ran = command_calls(r) - before
    assert handoff.claim_of(done.handed) is not None
    assert ran["sismember"] == 1 and ran["smembers"] == 1
    assert KNOWN_LIMITED.fresh(keys) == frozenset({"other"})
    r.sadd(keys.rate_limited_tenants(), "acme")  # a bucket set since: within the bound
    lease(r, keys, C3, LANE_FAST)
    measured(r, keys, C1)
    r.zadd(keys.ready(REGION, LANE_FAST), {f"{C1}@eu": checks})
    before = command_calls(r)
    handoff, done = complete(r, keys, C3)
    ran = command_calls(r) - before
    assert ran["sismember"] == 0 and ran["smembers"] == 0
    # the copy stands until its refresh: a bucket reaches the hand-offs within the bound
    claim = handoff.claim_of(done.handed)
    assert claim is not None and claim.job_id == f"{C1}@eu"


def test_a_fast_slot_with_nothing_fast_ready_reads_no_worker_hash(r, keys, checks):
    """The worker's hash (read when its registering process is another: a prefork child) is
    asked only once there is a candidate: slow work alone waiting costs a fast slot one pop."""
    lease(r, keys, C1, LANE_FAST)
    r.zrem(keys.due(), f"{C2}@eu", f"{C3}@eu")
    r.zadd(keys.ready(REGION, LANE_SLOW), {f"{C2}@eu": checks})
    before = command_calls(r)
    _handoff, done = complete(r, keys)
    ran = command_calls(r) - before
    assert done.handed == "" and done.refill_needs[0][2] == 1  # the slow one, for the refill
    assert ran["zpopmin"] == 1 and ran["hmget"] == 0
