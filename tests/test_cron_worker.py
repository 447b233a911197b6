"""Fired cron tasks run on a real (in-process) Celery worker; the runs show in list/diagnose."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from support.cron import T0, make_engine, sends
from support.polling import wait_for

from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.findings import FindingKind
from celery_app.redis.schema import Keys

MIN = timedelta(minutes=1)
KEYS = Keys("cbtest")


def _state(r, task_id, tenant=GLOBAL_TENANT):
    return r.hgetall(KEYS.cron_state(task_id, tenant))


def test_runs_are_recorded_failures_diagnosed_and_fired_again(cron_app, r, run_worker):
    ran: list[str] = []

    @cron("* * * * *", app=cron_app, id="good", name="w.good")
    def good():
        ran.append("good")

    @cron("* * * * *", app=cron_app, id="bad", name="w.bad")
    def bad():
        raise RuntimeError("boom at the database")

    @cron("* * * * *", app=cron_app, id="tenanted", name="w.tenanted", per_tenant=True)
    def tenanted(tenant):
        ran.append(f"tenant:{tenant}")

    r.sadd(KEYS.tenants(), "acme", "globex")
    engine = make_engine(cron_app)
    service = CronService(cron_app, clock=lambda: T0 + timedelta(seconds=30))
    run_worker(cron_app, ["celery"], 3)
    engine.tick(T0 + timedelta(seconds=1))
    wait_for(
        lambda: (
            _state(r, "good").get("outcome") == "success"
            and _state(r, "bad").get("outcome") == "failure"
            and _state(r, "tenanted", "globex").get("outcome") == "success"
        ),
        timeout=20,
        what="the first window's runs to be recorded",
    )
    assert sorted(ran) == ["good", "tenant:acme", "tenant:globex"]
    rows = {row.id: row for row in service.rows()}
    assert rows["good"].last_outcome == "success"
    assert rows["bad"].last_outcome == "failure"
    assert "boom at the database" in rows["bad"].last_error
    assert rows["good"].fired == 1 and rows["tenanted"].fired == 2
    assert _state(r, "bad")["last_run_window"] == window_id(T0)
    findings = service.diagnose()
    (failing,) = [f for f in findings if f.kind == FindingKind.FAILING]
    assert failing.subject == "bad" and "boom at the database" in failing.message
    assert "good" not in {f.subject for f in findings}
    # The worker released the in-flight keys: the next window fires everything again.
    report = engine.tick(T0 + MIN + timedelta(seconds=1))
    assert {f.task_id for f in report.fired} == {"good", "bad", "tenanted"}
    wait_for(lambda: _state(r, "bad").get("failed") == "2", timeout=20, what="second failure")
    wait_for(lambda: len(ran) == 6, timeout=20, what="second window's runs")
    run_worker.stop()


def test_overlapping_singleton_is_skipped_and_recorded(cron_app, r, run_worker):
    release = threading.Event()
    started = threading.Event()

    @cron("* * * * *", app=cron_app, id="long", name="w.long")
    def long_running():
        started.set()
        release.wait(20)

    engine = make_engine(cron_app)
    run_worker(cron_app, ["celery"], 3)
    engine.tick(T0 + timedelta(seconds=1))
    assert started.wait(20)
    second = engine.tick(T0 + MIN + timedelta(seconds=1))
    assert second.fired == ()
    assert [(s.task_id, s.reason) for s in second.skipped] == [("long", "in-flight")]
    state = _state(r, "long")
    assert (state["skipped"], state["last_skip_reason"]) == ("1", "in-flight")
    release.set()
    wait_for(lambda: _state(r, "long").get("outcome") == "success", timeout=20)
    third = engine.tick(T0 + 2 * MIN + timedelta(seconds=1))
    assert [f.task_id for f in third.fired] == ["long"]
    run_worker.stop()


def test_run_now_and_window_firing_share_one_lock(cron_app, broker_url, r):
    @cron("* * * * *", app=cron_app, id="contended", name="w.contended")
    def contended(): ...

    engine = make_engine(cron_app)
    outcomes = []
    for k in range(5):
        at = T0 + k * MIN + timedelta(seconds=2)
        service = CronService(cron_app, clock=lambda at=at: at)
        barrier = threading.Barrier(2)
        results: dict[str, object] = {}

        def beat(at=at, barrier=barrier, results=results):
            barrier.wait(10)
            results["beat"] = engine.tick(at)

        def manual(service=service, barrier=barrier, results=results):
            barrier.wait(10)
            results["manual"] = service.run_now("contended")

        threads = [threading.Thread(target=beat), threading.Thread(target=manual)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        beat_fired = bool(results["beat"].fired)
        manual_sent = results["manual"].sent
        assert beat_fired != manual_sent  # exactly one of them sent the window
        outcomes.append("manual" if manual_sent else "beat")
        assert sends(broker_url)[("contended", GLOBAL_TENANT, window_id(T0 + k * MIN))] == 1
        r.delete(KEYS.cron_inflight("contended", GLOBAL_TENANT))  # the run ended
    state = _state(r, "contended")
    assert state["fired"] == "5"


def test_run_now_is_recorded_as_manual_and_refuses_bad_requests(cron_app, r, run_worker):
    import pytest

    from celery_app.cron_tasks.service import CronUsageError

    @cron("0 3 * * *", app=cron_app, id="nightly", name="w.nightly")
    def nightly(): ...

    @cron("0 3 * * *", app=cron_app, id="per-tenant", name="w.pt", per_tenant=True)
    def per_tenant(tenant): ...

    r.sadd(KEYS.tenants(), "acme")
    service = CronService(cron_app, clock=lambda: T0 + timedelta(hours=5))
    with pytest.raises(CronUsageError, match="unknown cron task 'nope'"):
        service.run_now("nope")
    with pytest.raises(CronUsageError, match="per-tenant: pass --tenant"):
        service.run_now("per-tenant")
    with pytest.raises(CronUsageError, match="'ghost' is not an active tenant"):
        service.run_now("per-tenant", "ghost")
    with pytest.raises(CronUsageError, match="not per-tenant"):
        service.run_now("nightly", "acme")
    run_worker(cron_app, ["celery"], 3)
    result = service.run_now("per-tenant", "acme")
    assert result.sent
    waited = service.wait_for_run(result, timeout=20)
    assert (waited.outcome, waited.source) == ("success", "recorded")
    assert _state(r, "per-tenant", "acme")["manual"] == "1"
    again = service.run_now("per-tenant", "acme")
    assert not again.sent
    assert "already fired by manual:" in again.message
    run_worker.stop()


def test_a_recording_worker_says_so_and_a_forced_run_now_runs_once_as_manual(
    cron_app, r, run_worker
):
    """The worker marks itself in ``cron_recorders`` as it starts; while it is live, list and
    run --wait rely on records, and a run-now refused in a fired
    window runs with ``force`` as a manual run of its own, recorded as such."""
    ran: list[str] = []

    @cron("0 3 * * *", app=cron_app, id="nightly", name="w.nightly2")
    def nightly():
        ran.append("x")

    service = CronService(cron_app, clock=lambda: T0 + timedelta(hours=5))
    assert r.hlen(KEYS.cron_recorders()) == 0
    assert service.recording_workers() == []
    (row,) = service.rows()
    assert row.runs_recorded is False
    run_worker(cron_app, ["celery"], 3)
    assert r.hlen(KEYS.cron_recorders()) == 1
    service = CronService(cron_app, clock=lambda: T0 + timedelta(hours=5))
    assert len(service.recording_workers()) == 1
    first = service.run_now("nightly")
    assert first.sent
    assert service.wait_for_run(first, timeout=20).outcome == "success"
    refused = service.run_now("nightly")
    assert not refused.sent and "--force" in refused.message
    forced = service.run_now("nightly", force=True)
    assert forced.sent and forced.window != first.window
    assert "." in forced.window  # to the microsecond: no scheduled window's id
    waited = service.wait_for_run(forced, timeout=20)
    assert (waited.outcome, waited.source) == ("success", "recorded")
    state = _state(r, "nightly")
    assert (state["last_run_window"], state["manual"]) == (forced.window, "1")
    # a forced run takes no window or in-flight key: the scheduled windows are untouched
    assert not r.exists(KEYS.cron_inflight("nightly", GLOBAL_TENANT))
    assert not r.exists(KEYS.cron_window("nightly", GLOBAL_TENANT, forced.window))
    run_worker.stop()
    assert ran == ["x", "x"]


def test_a_celery_worker_process_marks_itself_recording_until_its_clean_stop(
    start_worker_process, r
):
    """``celery -A celery_app worker`` (recording among its modules): marked when ready,
    unmarked at a warm shutdown, so a stopped fleet is not taken for a recording one."""
    worker = start_worker_process("-P", "solo", "-n", "rec1@%h")
    wait_for(
        lambda: any(name.startswith("rec1@") for name in r.hkeys(KEYS.cron_recorders())),
        timeout=60,
        what="the worker's recording marker",
    )
    wait_for(lambda: " ready." in worker.output(), timeout=60, what="the worker is ready")
    assert worker.stop() == 0, worker.output()[-3000:]
    assert r.hkeys(KEYS.cron_recorders()) == []


def test_diagnose_says_not_recorded_without_recording_workers_and_lost_with_them(cron_app, r):
    """A fired window no worker ever started: "lost" only when a live worker records runs;
    otherwise a note (not a finding) that its run is not recorded."""

    @cron("* * * * *", app=cron_app, id="minutely", name="w.minutely")
    def minutely(): ...

    at = T0 + timedelta(seconds=1)
    later = at + 3 * MIN
    r.hset(KEYS.beat_heartbeat(), "beat-x", later.timestamp())
    engine = make_engine(cron_app)
    report = engine.tick(at)
    assert [f.task_id for f in report.fired] == ["minutely"]
    plain = CronService(cron_app, clock=lambda: later)
    findings, notes = plain.diagnose(), plain.notes()
    assert FindingKind.NEVER_STARTED not in {f.kind for f in findings}, findings
    assert any("its run is not recorded (workers do not run checkbeat's recording)" in n
               for n in notes), notes  # fmt: skip
    r.hset(KEYS.cron_recorders(), "celery@w1", time.time())
    recorded = CronService(cron_app, clock=lambda: later)
    assert recorded.notes() == []
    (lost,) = [f for f in recorded.diagnose() if f.kind == FindingKind.NEVER_STARTED]
    assert (lost.subject, lost.since) == ("minutely", T0)
    assert "lost with the broker" in lost.message


def test_a_forced_run_of_a_task_without_grace_may_still_wait_a_minute_for_a_worker(
    cron_app, broker_url, r
):
    """A forced run's message expires at the task's grace after it is sent, at least a minute:
    with ``grace=0`` it would expire as it is sent and never run."""
    from datetime import datetime

    import redis as redis_lib
    from support.cron import broker_headers

    redis_lib.Redis.from_url(broker_url).flushdb()

    @cron("0 3 * * *", app=cron_app, id="strict", name="w.strict", grace=timedelta(0))
    def strict(): ...

    now = T0 + timedelta(hours=5, seconds=7)
    service = CronService(cron_app, clock=lambda: now)
    assert service.run_now("strict").sent  # takes the window
    forced = service.run_now("strict", force=True)
    assert forced.sent
    (headers,) = [h for h in broker_headers(broker_url) if h["cron_window"] == forced.window]
    assert headers["cron_manual"] is True
    expires = datetime.fromisoformat(headers["expires"])
    assert expires - now >= timedelta(minutes=1), (expires, now)
