"""The run task and the post-exec write, on a real in-process worker against a real HTTP server.

These runs are claimed by hand (test data, as the dispatcher's claim writes it); the lane and
timeout behaviour through the real dispatcher is in test_worker_lanes.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from celery.signals import task_postrun
from support.checks import RECORD_KEYS, results
from support.partitions import suite_keys
from support.polling import wait_for
from support.round_trips import command_calls

from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import BadRunMessage, RunRequest
from celery_app.checks.store import CheckStore
from celery_app.redis.schema import check_queue, job_id
from celery_app.settings import load_settings

KEYS = suite_keys("cbtest")
QUEUES = [check_queue("local", "fast"), check_queue("local", "slow")]


@pytest.fixture
def finished() -> threading.Event:
    """Set whenever a checkbeat.run_check run has returned (task_postrun), whatever it did."""
    event = threading.Event()

    def on_postrun(task=None, **_):
        if getattr(task, "name", "") == "checkbeat.run_check":
            event.set()

    task_postrun.connect(on_postrun, weak=False)
    yield event
    task_postrun.disconnect(on_postrun)


def store_for(r, app_settings) -> CheckStore:
    return CheckStore(r, KEYS, app_settings)


def send(app, kwargs, lane: str = "fast", args=()):
    return app.send_task(
        "checkbeat.run_check", args=args, kwargs=kwargs, queue=check_queue("local", lane)
    )


def test_a_run_records_its_result_and_folds_its_cost(
    r, claim, make_app, run_worker, target, allow_private
):
    app = make_app(allow_private_targets=True)
    settings = app.conf.checkbeat_settings
    store = store_for(r, settings)
    store.create(uid="web", tenant="acme", kind="http", target=target.url("/delay/60"), period=60)
    job = job_id("web", "local")
    kwargs = claim(r, KEYS, job, "tok-1")
    run_worker(app, QUEUES, hostname="probe@test")
    before = time.time()
    send(app, kwargs)

    wait_for(lambda: r.xlen(KEYS.results("web")) == 1, 20, what="the result")
    state = read_job(r, KEYS, job)
    assert state.lease_token is None and state.runs == 1
    assert 60 <= state.cost_ewma_ms < 2000  # the first sample seeds the EWMA
    assert state.scheduled_at > before  # placed at its next tick
    assert r.zscore(KEYS.of_job(job).due(), job) == pytest.approx(state.scheduled_at, abs=0.01)
    assert r.zcard(KEYS.of_job(job).leases("local", 0)) == 0
    (result,) = results(r, KEYS, "web")
    assert result["status"] == "up" and result["error_class"] is None
    assert result["latency_ms"] >= 60
    assert result["region"] == "local" and result["worker"]  # the node (host in tests)
    assert result["started_at"] and result["scheduled_at"]
    assert set(result) == RECORD_KEYS  # the reaper writes the same shape
    assert (result["lane"], result["queue"], result["timed_out"]) == ("fast", QUEUES[0], False)
    assert json.loads(r.hget(KEYS.last_result("web"), "local")) == result


def test_errors_carry_their_class_and_a_refused_target_is_a_result(
    r, claim, make_app, run_worker, target, allow_private
):
    app = make_app(allow_private_targets=False)  # the workers' guard is on
    store = store_for(r, load_settings(key_prefix="cbtest"))
    store.create(uid="down", tenant="t", kind="http", target=target.url("/status/503"), period=60)
    store.create(uid="lo", tenant="t", kind="tcp", target=f"127.0.0.1:{target.port}", period=60)
    run_worker(app, QUEUES)
    send(app, claim(r, KEYS, job_id("down", "local"), "a"))
    send(app, claim(r, KEYS, job_id("lo", "local"), "b"))
    wait_for(lambda: r.exists(KEYS.results("down"), KEYS.results("lo")) == 2, 20)
    assert results(r, KEYS, "down")[0]["error_class"] == "refused"  # 127.0.0.1 without permission
    assert results(r, KEYS, "lo")[0]["error_class"] == "refused"
    assert target.hits("/status/503") == 0

    run_worker.stop()  # the guarded worker must not take the next message
    app = make_app(allow_private_targets=True)
    run_worker(app, QUEUES)
    send(app, claim(r, KEYS, job_id("down", "local"), "c"))
    wait_for(lambda: r.xlen(KEYS.results("down")) == 2, 20)
    last = results(r, KEYS, "down")[-1]
    assert (last["status"], last["error_class"], last["detail"]["status_code"]) == (
        "down",
        "status",
        503,
    )


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_bad_messages_are_rejected_and_the_worker_keeps_going(
    r, claim, make_app, run_worker, target, allow_private
):
    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(uid="ok", tenant="t", kind="http", target=target.url("/delay/0"), period=60)
    good = claim(r, KEYS, job_id("ok", "local"), "tok")
    run_worker(app, QUEUES, concurrency=1)
    collect = Collect()
    logging.getLogger("workers.tasks").addHandler(collect)
    bad = [
        ({k: v for k, v in good.items() if k != "lease_token"}, "lease_token must be"),
        ({**good, "scheduled_at": "yesterday"}, "scheduled_at must be a number"),
        ({**good, "timeout_s": -1}, "timeout_s must be > 0"),
        ({**good, "timeout_s": 10**400}, "timeout_s must be at most 17 s"),
        ({**good, "scheduled_at": 10**400}, "scheduled_at must be between 0 and"),
        ({**good, "job_id": "no-region"}, "job_id"),
        ({**good, "job_id": "ghost@local"}, "unknown job ghost@local"),
    ]
    for kwargs, _ in bad:
        send(app, kwargs)
    send(app, {}, args=("positional",))
    send(app, good)
    wait_for(lambda: r.xlen(KEYS.results("ok")) == 1, 20, what="the good run after bad ones")
    logging.getLogger("workers.tasks").removeHandler(collect)
    logged = "\n".join(collect.lines)
    for _, message in bad:
        assert message in logged
    assert "takes keyword arguments only" in logged
    assert target.hits("/delay/0") == 1


def test_a_stale_message_is_dropped_without_probing(
    r, claim, make_app, run_worker, target, allow_private, finished
):
    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(uid="c", tenant="t", kind="http", target=target.url("/delay/0"), period=60)
    kwargs = claim(r, KEYS, job_id("c", "local"), "current")
    run_worker(app, QUEUES)
    send(app, {**kwargs, "lease_token": "reaped-long-ago"})
    assert finished.wait(20)
    assert target.hits("/delay/0") == 0
    assert read_job(r, KEYS, job_id("c", "local")).lease_token == "current"


def test_a_check_deleted_while_it_runs_is_discarded(
    r, claim, make_app, run_worker, target, allow_private, finished
):
    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(uid="gone", tenant="t", kind="http", target=target.url("/delay/700"), period=60)
    kwargs = claim(r, KEYS, job_id("gone", "local"), "tok")
    run_worker(app, QUEUES)
    send(app, kwargs)
    wait_for(lambda: target.hits("/delay/700") == 1, 20, what="the probe to start")
    assert store.delete("gone")
    assert finished.wait(20)
    assert not r.exists(KEYS.job(job_id("gone", "local")))
    assert not r.exists(KEYS.results("gone"), KEYS.last_result("gone"))
    assert r.zscore(KEYS.due(), job_id("gone", "local")) is None


CEILING_S = 17.0  # the default 15 s ceiling + the 2 s hard-limit margin
GOOD = {
    "job_id": "c@local",
    "lease_token": "7.1",
    "scheduled_at": 1_700_000_000.0,
    "effective_scheduled_at": 1_700_000_000.5,
    "timeout_s": 15,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timeout_s": True}, "timeout_s must be a number"),
        ({"scheduled_at": float("nan")}, "scheduled_at must be finite"),
        ({"effective_scheduled_at": None}, "effective_scheduled_at must be a number"),
        ({"lease_token": ""}, "lease_token must be a non-empty string"),
        ({"job_id": 42}, "job_id must be a non-empty string"),
    ],
)
def test_run_request_refuses_wrong_types_without_coercion(change, message):
    with pytest.raises(BadRunMessage, match=message):
        RunRequest.parse({**GOOD, **change}, max_timeout_s=CEILING_S)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"scheduled_at": 10**400},
            r"scheduled_at must be between 0 and .* an integer of 1329 bits",
        ),
        ({"effective_scheduled_at": 1e300}, "effective_scheduled_at must be between 0 and"),
        ({"scheduled_at": -1.0}, "scheduled_at must be between 0 and"),
        ({"effective_scheduled_at": 253_402_300_800}, "effective_scheduled_at must be between"),
        ({"timeout_s": 10**400}, r"timeout_s must be at most 17 s .* an integer of 1329 bits"),
        ({"timeout_s": 3600}, r"timeout_s must be at most 17 s .*got 3600"),
        ({"timeout_s": 17.001}, "timeout_s must be at most 17 s"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be finite"),
        ({"job_id": "a b@local"}, "job_id must be at most 512 characters without whitespace"),
        ({"lease_token": "7" * 513}, "lease_token must be at most 512 characters"),
    ],
)
def test_run_request_refuses_out_of_range_numbers_and_names_the_field(change, message):
    with pytest.raises(BadRunMessage, match=message):
        RunRequest.parse({**GOOD, **change}, max_timeout_s=CEILING_S)


def test_a_json_1e400_is_infinite_and_refused():
    kwargs = json.loads('{"job_id": "c@local", "lease_token": "7.1", "scheduled_at": 1e400}')
    with pytest.raises(BadRunMessage, match="scheduled_at must be finite"):
        RunRequest.parse(kwargs, max_timeout_s=CEILING_S)


def test_run_request_ignores_fields_a_newer_dispatcher_may_add():
    request = RunRequest.parse({**GOOD, "lane": 1}, max_timeout_s=CEILING_S)
    assert (request.uid, request.region, request.timeout_s) == ("c", "local", 15.0)
    assert RunRequest.parse(request.kwargs(), max_timeout_s=CEILING_S) == request
    assert RunRequest.parse({**GOOD, "timeout_s": CEILING_S}, max_timeout_s=CEILING_S)


def test_a_duplicated_delivery_of_one_lease_probes_the_target_once(
    r, claim, make_app, run_worker, target, allow_private
):
    """A publish retried after its reply was lost leaves two copies of one run message: both
    hold the current lease token, so only the started marker keeps the probe to one."""
    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(uid="dup", tenant="t", kind="http", target=target.url("/delay/700"), period=60)
    kwargs = claim(r, KEYS, job_id("dup", "local"), "tok-dup")
    returned: list[dict] = []

    def on_postrun(task=None, retval=None, **_):
        if getattr(task, "name", "") == "checkbeat.run_check":
            returned.append(retval)

    task_postrun.connect(on_postrun, weak=False)
    try:
        run_worker(app, QUEUES, concurrency=2)  # a free slot for each copy, side by side
        send(app, kwargs)
        send(app, kwargs)
        wait_for(lambda: len(returned) == 2, 20, what="both copies to return")
    finally:
        task_postrun.disconnect(on_postrun)
    assert target.hits("/delay/700") == 1
    assert r.xlen(KEYS.results("dup")) == 1
    assert [x for x in returned if "discarded" in x] == [
        {"discarded": "a run of the same lease already started (a duplicated delivery)"}
    ]
    marker = KEYS.run_started(job_id("dup", "local"), "tok-dup")
    assert r.ttl(marker) > 0  # it expires: no marker is kept forever


def test_the_start_read_takes_only_what_the_run_probes(r, claim, make_app, target):
    """The start read takes the check's kind, target and config, not its whole hash: a
    deleted check reads as absent, a torn one is an error that names what is missing."""
    from celery_app.checks.start_read import read_start
    from celery_app.redis.schema import CheckField, JobField

    app = make_app(allow_private_targets=True)
    url = target.url("/delay/0")
    store_for(r, app.conf.checkbeat_settings).create(
        uid="c", tenant="t", kind="http", target=url, period=60, config={"method": "HEAD"}
    )
    job = job_id("c", "local")
    claim(r, KEYS, job, "tok")
    read = read_start(r, KEYS, job, "c", "tok", "celery-id", 60_000)
    assert read.first_delivery and read.check_exists
    assert read.check_fields[:2] == ("http", url)
    probe = read.probe()
    assert (probe.kind, probe.target, probe.config["method"]) == ("http", url, "HEAD")

    store_for(r, app.conf.checkbeat_settings).update("c", config={"method": "GET"})
    edited = read_start(r, KEYS, job, "c", "tok", "celery-id-0", 60_000).probe()
    assert edited.config["method"] == "GET"  # the job's digest moved: the check read again

    # a job without a digest (written before it existed) reads its check on every run
    r.hdel(KEYS.job(job), JobField.PROBE_DIGEST)
    r.hset(KEYS.check("c"), CheckField.CONFIG, "[1]")  # written by something else
    with pytest.raises(ValueError, match="config is not a JSON object"):
        read_start(r, KEYS, job, "c", "tok", "celery-id-1", 60_000).probe()
    r.hdel(KEYS.check("c"), CheckField.KIND)  # torn: the run cannot know what to probe
    with pytest.raises(ValueError, match="no kind or no target"):
        read_start(r, KEYS, job, "c", "tok", "celery-id-2", 60_000).probe()
    r.delete(KEYS.check("c"))
    assert not read_start(r, KEYS, job, "c", "tok", "celery-id-3", 60_000).check_exists


def test_only_the_current_leases_first_start_is_a_first_delivery(r, claim, make_app, target):
    """The started marker is keyed by the lease token: a stale message (an older lease of the
    job) is no first delivery, leaves no marker and takes nothing from the current lease, whose
    first start is one and whose second is not."""
    from celery_app.checks.start_read import read_start

    app = make_app(allow_private_targets=True)
    store_for(r, app.conf.checkbeat_settings).create(
        uid="c", tenant="t", kind="http", target=target.url("/delay/0"), period=60
    )
    job = job_id("c", "local")
    claim(r, KEYS, job, "tok-2")
    assert not read_start(r, KEYS, job, "c", "tok-1", "celery-old", 60_000).first_delivery
    assert not r.exists(KEYS.run_started(job, "tok-1"))  # the stale message left nothing
    assert read_start(r, KEYS, job, "c", "tok-2", "celery-new", 60_000).first_delivery
    assert not read_start(r, KEYS, job, "c", "tok-2", "celery-again", 60_000).first_delivery
    assert r.get(KEYS.run_started(job, "tok-2")) == "celery-new"


def test_a_start_read_asks_for_the_maintenance_version_at_most_once_a_refresh(r):
    """The process plans with the maintenance version it last read; a start read asks for it
    again only once that reading is ``VERSION_REFRESH_S`` old (one GET, not one per run)."""
    from celery_app.checks.maintenance import VERSION_REFRESH_S
    from celery_app.checks.start_read import read_start

    job = "c@local"
    keys = suite_keys(f"cbfresh{time.monotonic_ns()}").of_job(job)  # a version never read here

    def planned_with() -> str | None:
        return read_start(r, keys, job, "c", "tok", "celery-id", 60_000).maintenance_version

    r.set(keys.maintenance_version(), "v1")
    before, first = command_calls(r)["get"], time.monotonic()
    assert planned_with() == "v1"
    assert command_calls(r)["get"] - before == 1
    r.set(keys.maintenance_version(), "v2")
    before = command_calls(r)["get"]
    assert planned_with() == "v1"  # the version as last read
    assert command_calls(r)["get"] - before == 0
    wait_for(lambda: planned_with() == "v2", 10, what="the version read again")
    assert time.monotonic() - first >= VERSION_REFRESH_S


def test_a_window_written_since_the_worker_last_read_the_version_holds_the_next_change(
    r, claim, make_app, run_worker, target, allow_private
):
    """A run's write is planned with the maintenance version its process last read (at most
    ``VERSION_REFRESH_S`` ago): a window written since sends a write that changes the check's
    state back to read, and the window holds the change."""
    from celery_app.checks.maintenance import WINDOWS, MaintenanceStore, validate_window

    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(
        uid="mw", tenant="t", kind="http", target=target.url("/status/503"), period=60,
        failure_threshold=1, success_threshold=1,
    )  # fmt: skip
    job = job_id("mw", "local")
    run_worker(app, QUEUES)
    send(app, claim(r, KEYS, job, "a"))  # the first run: down, and the transition it makes
    wait_for(lambda: r.hget(KEYS.check_state("mw"), "s") == "down", 20, what="down")
    seen = WINDOWS.known_version(KEYS.of_job(job))
    store.update("mw", target=target.url("/status/200"))  # up again at its next run
    always = validate_window(uid="mw", cron="* * * * *", duration=3600, timezone="UTC")
    MaintenanceStore(r, KEYS).add(always)
    written = r.get(KEYS.of_job(job).maintenance_version())
    assert written is not None and written != seen  # the worker plans with an older version

    send(app, claim(r, KEYS, job, "b"))
    wait_for(lambda: r.xlen(KEYS.results("mw")) == 2, 20, what="the second run")
    last = results(r, KEYS, "mw")[-1]
    assert (last["status"], last["maintenance"]) == ("up", True)
    state = r.hgetall(KEYS.check_state("mw"))
    assert (state["s"], state["o"]) == ("down", "up") and "hu" in state  # held, not announced
    assert WINDOWS.known_version(KEYS.of_job(job)) == written  # learnt for the runs after


def test_a_run_reads_its_check_only_when_the_check_was_written_since(r, claim, make_app, target):
    """The start read sends the check's kind, target and config only when the job's digest of
    them is not the one the process keeps: an unedited check's run reads its job alone, every
    write through the store (even one that changes the target only) is seen by the next run."""
    from celery_app.checks.definition import probe_digest
    from celery_app.checks.start_read import KEPT, read_start
    from celery_app.redis.schema import CheckField, JobField

    app = make_app(allow_private_targets=True)
    store = store_for(r, app.conf.checkbeat_settings)
    store.create(uid="k", tenant="t", kind="http", target=target.url("/a"), period=60)
    job = job_id("k", "local")
    digest = r.hget(KEYS.job(job), JobField.PROBE_DIGEST)
    stored = r.hmget(KEYS.check("k"), CheckField.KIND, CheckField.TARGET, CheckField.CONFIG)
    assert digest == probe_digest(*stored)

    def hmgets_of_the_check(token: str) -> tuple[int, str]:
        claim(r, KEYS, job, token)
        before = r.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
        read = read_start(r, KEYS, job, "k", token, f"celery-{token}", 60_000)
        after = r.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
        return after - before, read.probe().target

    kept = KEPT.get(KEYS.check("k"))  # an earlier test's check "k" may be kept already
    read_before = 0 if kept is not None and kept[0] == digest else 1
    assert hmgets_of_the_check("t1") == (read_before, target.url("/a"))
    assert hmgets_of_the_check("t2") == (0, target.url("/a"))  # kept: the job's digest is it
    store.update("k", target=target.url("/b"))
    assert hmgets_of_the_check("t3") == (1, target.url("/b"))  # edited: read again
    assert hmgets_of_the_check("t4") == (0, target.url("/b"))
    # deleted and created again: its version starts over, its digest does not
    store.delete("k")
    store.create(uid="k", tenant="t", kind="http", target=target.url("/c"), period=60)
    assert hmgets_of_the_check("t5") == (1, target.url("/c"))
