"""The post-exec write planned from the run's start read: complete.lua writes it only while the
job and the maintenance version are as the run read them (``jobs.ReadGuard``), else nothing,
and the worker reads again and plans again (``checks.completion``, ``workers.post_exec``)."""

from __future__ import annotations

import pytest
from support.checks import at
from support.partitions import suite_keys
from support.polling import wait_for
from support.round_trips import command_calls
from support.workers import claim_by_hand

from celery_app.checks.check_state import HealthUpdate
from celery_app.checks.completion import Handoff, complete_as_read
from celery_app.checks.jobs import JobState, ReadGuard, plan_completion, read_job
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.checks.store import CheckStore
from celery_app.redis.clock import from_time_reply
from celery_app.redis.schema import JobField, check_queue, job_id
from scheduling_core import Params
from scheduling_core.health import State, region_step

JOB = "c1@eu"
TOKEN = "7.1"


@pytest.fixture
def started(store, r, keys):
    """A leased job and what its run read when it started: (job, guard)."""
    store.create(uid="c1", tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"])
    claim_by_hand(r, keys, JOB, TOKEN)
    return start_read(r, keys)


def start_read(r, keys) -> tuple[JobState, ReadGuard]:
    h = r.hgetall(keys.job(JOB))
    return JobState.from_hash(JOB, h), ReadGuard.of(h, r.get(keys.maintenance_version()))


def unregistered(now_s: float) -> Handoff:
    """A worker that is not registered: nothing is handed off, the refill's reads still come
    back."""
    return Handoff("nobody@test", "eu", 60.0, now=now_s)


def moved_to(state: State):
    """The health step of a run pointing to ``state`` with thresholds of 1: the region moves
    there at once (and the check's state is counted)."""
    return lambda job, now: HealthUpdate(
        uid="c1", tenant="acme", regions=("eu",), quorum=1, now=now.timestamp(),
        region_health=region_step(job.health, state, 1, 1),
    )  # fmt: skip


def write(r, keys, job: JobState, guard: ReadGuard, health_of=None):
    now_s = job.scheduled_at + 0.2
    run = plan_completion(
        Params(),
        job,
        TOKEN,
        now=at(now_s),
        duration_ms=40.0,
        timed_out=False,
        exec_start=at(now_s - 0.05),
        record=RunRecord(RunStatus.UP, "eu", finished_at=now_s),
        health_of=health_of,
    )
    return complete_as_read(r, keys, run, guard, unregistered(now_s), results_maxlen=10)


def test_an_unchanged_job_is_written_and_the_refill_reads_see_the_write(r, keys, started):
    job, guard = started
    done = write(r, keys, job, guard)
    assert done is not None and (done.written, done.transition, done.handed) == (True, None, "")
    after = read_job(r, keys, JOB)
    assert after.lease_token is None and after.runs == 1 and after.cost_ewma_ms == 40.0
    [(time_reply, first_due, waiting)] = done.refill_needs  # read in the same call, after the write
    # the refill's cut-off is the time the write was planned at, not one more TIME of Redis's
    assert from_time_reply(time_reply) == pytest.approx(job.scheduled_at + 0.2, abs=2e-6)  # µs
    assert first_due[0] == JOB and float(first_due[1]) == pytest.approx(after.scheduled_at)
    assert waiting == 0  # nothing ready, nothing held
    assert r.xlen(keys.results("c1")) == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r, k: r.hset(k.job(JOB), JobField.PERIOD, "120"), id="field-changed"),
        pytest.param(lambda r, k: r.hset(k.job(JOB), JobField.DISABLED, "1"), id="field-added"),
        pytest.param(lambda r, k: r.hdel(k.job(JOB), JobField.REGIONS), id="field-removed"),
        pytest.param(
            lambda r, k: r.hset(k.job(JOB), JobField.COST_EWMA_MS, "1e3"), id="same-length-value"
        ),
    ],
)
def test_a_job_or_window_changed_since_the_read_is_not_written(r, keys, started, change):
    job, guard = started
    change(r, keys)
    before = r.hgetall(keys.job(JOB))
    assert write(r, keys, job, guard) is None
    assert r.hgetall(keys.job(JOB)) == before  # nothing written, the lease still held
    assert r.xlen(keys.results("c1")) == 0 and r.zscore(keys.due(), JOB) is None


def test_a_window_written_since_holds_back_only_a_write_that_counts_the_checks_state(
    r, keys, started
):
    """The windows decide something only when the run counts the check's state (a change held
    or delivered): a window written since the plan's version sends that write back, and a
    write that moves no state goes through (as if it had landed just before the window)."""
    job, guard = started
    assert write(r, keys, job, guard, moved_to(State.UP)).written  # the state's first count
    claim_by_hand(r, keys, JOB, TOKEN)
    job, guard = start_read(r, keys)
    r.set(keys.maintenance_version(), "w1")
    before = r.hgetall(keys.job(JOB))
    assert write(r, keys, job, guard, moved_to(State.DOWN)) is None
    assert r.hgetall(keys.job(JOB)) == before and r.xlen(keys.results("c1")) == 1
    assert r.hget(keys.check_state("c1"), "o") == "up"
    done = write(r, keys, job, guard, moved_to(State.UP))  # up, as it was: nothing counted
    assert done is not None and done.written
    assert read_job(r, keys, JOB).runs == 2 and r.xlen(keys.results("c1")) == 2
    # planned with the version as it now is, the change is written
    claim_by_hand(r, keys, JOB, TOKEN)
    job, guard = start_read(r, keys)
    done = write(r, keys, job, guard, moved_to(State.DOWN))
    assert done is not None and done.written and done.transition is not None


def test_values_are_compared_exactly_whatever_bytes_they_hold(r, keys, started):
    # Two values moving a byte between them concatenate to the same text: still a change.
    r.hset(keys.job(JOB), mapping={"x1": "ab", "x2": "c", "x3": "é 1 é"})
    job, guard = start_read(r, keys)
    r.hset(keys.job(JOB), mapping={"x1": "a", "x2": "bc"})
    assert write(r, keys, job, guard) is None
    # Unchanged multibyte and spaced values compare equal.
    job, guard = start_read(r, keys)
    done = write(r, keys, job, guard)
    assert done is not None and done.written


def test_a_lease_no_longer_ours_is_refused_as_before_not_as_changed(r, keys, started):
    job, guard = started
    claim_by_hand(r, keys, JOB, "8.1")  # reaped and claimed again: the guard's fields moved too
    done = write(r, keys, job, guard)
    assert done is not None and not done.written


def test_a_worker_replans_a_run_whose_check_was_edited_while_it_ran(
    r, claim, make_app, run_worker, target, allow_private
):
    """A failing run planned from the start read would keep the region up (threshold 3); the
    threshold was lowered to 1 while it ran, so the write is planned again: the region is down."""
    app = make_app(allow_private_targets=True)
    keys = suite_keys("cbtest")
    store = CheckStore(r, keys, app.conf.checkbeat_settings)
    store.create(
        uid="edited", tenant="acme", kind="http", target=target.url("/delay/700"), period=60,
        config={"expected_status": [500]}, failure_threshold=3,
    )  # fmt: skip
    job = job_id("edited", "local")
    kwargs = claim(r, keys, job, "tok-1")
    run_worker(app, [check_queue("local", "fast"), check_queue("local", "slow")])
    app.send_task("checkbeat.run_check", kwargs=kwargs, queue=check_queue("local", "fast"))
    wait_for(lambda: target.hits("/delay/700") == 1, 20, what="the probe to start")
    store.update("edited", failure_threshold=1)
    wait_for(lambda: r.xlen(keys.results("edited")) == 1, 20, what="the result")
    state = read_job(r, keys, job)
    assert state.lease_token is None and state.runs == 1
    assert state.failure_threshold == 1
    assert str(state.health.state) == "down"


def test_a_worker_run_reads_its_job_once(r, claim, make_app, run_worker, target, allow_private):
    """The post-exec write is planned from the start read: the job hash is read twice only (the
    start read's HGETALL, with the check's kind, target and config by HMGET; and complete.lua's
    guard, inside its own call), never by a read of its own after the probe."""
    app = make_app(allow_private_targets=True)
    keys = suite_keys("cbtest")
    store = CheckStore(r, keys, app.conf.checkbeat_settings)
    store.create(uid="once", tenant="acme", kind="http", target=target.url("/delay/0"), period=60)
    kwargs = claim(r, keys, job_id("once", "local"), "tok-1")
    run_worker(app, [check_queue("local", "fast"), check_queue("local", "slow")])
    before = calls(r, "hgetall"), calls(r, "evalsha")
    app.send_task("checkbeat.run_check", kwargs=kwargs, queue=check_queue("local", "fast"))
    wait_for(lambda: r.xlen(keys.results("once")) == 1, 20, what="the result")
    assert calls(r, "hgetall") - before[0] == 2  # the start read, complete.lua's guard
    # one script, the completion: the start read is plain commands, and the refill's reads
    # are the completion's own (its hand-off)
    assert calls(r, "evalsha") - before[1] == 1
    assert read_job(r, keys, job_id("once", "local")).runs == 1


def calls(r, command: str) -> int:
    return command_calls(r)[command]
