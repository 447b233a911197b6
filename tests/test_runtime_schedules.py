"""Runtime schedules (``schedule add|update|rm|pause|resume`` and the Python API): validated
before anything is written, seen by a running beat at its next tick, refused when they would
shadow a task declared in code."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from pathlib import Path

import pytest
from support.cron import T0, end_runs, sends
from support.projects import run_module

import beat.scheduler as scheduler_module
from beat.scheduler import CronScheduler
from celery_app.cron_tasks.registration import cron, window_id
from celery_app.cron_tasks.runtime import (
    ScheduleConflict,
    ScheduleInputError,
    add_schedule,
    parse_duration,
    pause_schedule,
    remove_schedule,
    resume_schedule,
    runtime_store,
    update_schedule,
)
from celery_app.cron_tasks.service import CronService
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.findings import FindingKind
from celery_app.redis.schema import CronSource, Keys

ROOT = Path(__file__).resolve().parents[1]
KEYS = Keys("cbtest")
SEC = timedelta(seconds=1)
MIN = timedelta(minutes=1)


def _noop(*args, **kwargs) -> None: ...


def _runtime_keys(r) -> list[str]:
    return sorted(r.scan_iter("cbtest:cron:runtime*"))


#: proj.ping is not a task of cron_app: it lives on the workers (--remote-task).
GOOD = {"task": "proj.ping", "every": "20s", "remote_task": True}

#: (field, bad value, what the error says): one per field of add/update.
BAD_FIELDS = [
    ("task", "", "not a task name"),
    ("task", "proj ping", "not a task name"),
    ("cron", "61 * * * *", "invalid spec"),
    ("every", "20 parsecs", "must be a number of seconds"),
    ("every", "0.5", "from 1 second to 366 days"),
    ("every", "99999999999999999999d", "must be a number of seconds"),
    ("every", "367d", "from 1 second to 366 days"),
    ("args", "[1,", "must be a JSON list"),
    ("args", '{"a": 1}', "must be a JSON list"),
    ("kwargs", "[1]", "must be a JSON object"),
    ("kwargs", "{bad", "must be a JSON object"),
    ("queue", "no spaces", "not a queue name"),
    ("timezone", "Mars/Olympus", "unknown timezone"),
    ("timeout", "0", "more than 0"),
    ("timeout", "soon", "must be a number of seconds"),
    ("grace", "-5", "from 0 to 1 day"),
    ("grace", "2d", "from 0 to 1 day"),
    ("overlap", "sometimes", "must be one of skip, allow"),
    ("expected_duration", "0", "more than 0 and at most the timeout"),
    ("expected_duration", "1h", r"at most the timeout \(300s\)"),
    ("expected_duration", "soon", "must be a number of seconds"),
]


def _with(field, value):
    fields = dict(GOOD)
    if field == "cron":
        fields.pop("every")
    fields[field] = value
    return fields


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS)
def test_add_refuses_each_bad_field_naming_it_and_writes_nothing(
    cron_app, r, field, value, message
):
    with pytest.raises(ScheduleInputError, match=message) as caught:
        add_schedule(cron_app, "ping", **_with(field, value))
    assert caught.value.field == field
    assert _runtime_keys(r) == []


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS)
def test_update_refuses_each_bad_field_naming_it_and_changes_nothing(
    cron_app, r, field, value, message
):
    add_schedule(cron_app, "ping", **GOOD)
    before = {k: r.dump(k) for k in _runtime_keys(r)}
    with pytest.raises(ScheduleInputError, match=message) as caught:
        update_schedule(cron_app, "ping", **{field: value})
    assert caught.value.field == field
    assert {k: r.dump(k) for k in _runtime_keys(r)} == before


def test_bad_id_and_both_or_neither_schedule_are_refused(cron_app, r):
    with pytest.raises(ScheduleInputError, match="id: 'a b' is not a valid id"):
        add_schedule(cron_app, "a b", **GOOD)
    with pytest.raises(ScheduleInputError, match="exactly one of cron"):
        add_schedule(cron_app, "x", task="t", cron="* * * * *", every="5s")
    with pytest.raises(ScheduleInputError, match="exactly one of cron"):
        add_schedule(cron_app, "x", task="t")
    assert _runtime_keys(r) == []


def test_durations():
    assert parse_duration("1h30m", "x") == timedelta(minutes=90)
    assert parse_duration("90", "x") == timedelta(seconds=90)
    assert parse_duration("500ms", "x") == timedelta(milliseconds=500)
    for bad in ("", "1x", "h", "1h 30m", "nan", "inf"):
        with pytest.raises(ScheduleInputError, match="x: must be"):
            parse_duration(bad, "x")


def test_the_python_api_lifecycle(cron_app, r):
    version = runtime_store(cron_app).version()
    add_schedule(
        cron_app, "ping", task="proj.ping", every="20s", args="[1]", kwargs='{"k": "v"}',
        grace="5s", overlap="allow", queue="pings", remote_task=True,
    )  # fmt: skip
    store = runtime_store(cron_app)
    assert store.version() != version
    task = all_tasks(cron_app, store)["ping"]
    assert (task.source, task.spec, task.window_length, task.grace, task.overlap) == (
        CronSource.RUNTIME, "every 20 seconds", 20 * SEC, 5 * SEC, "allow",
    )  # fmt: skip
    assert task.call_arguments() == ([1], {"k": "v"}) and task.queue == "pings"
    with pytest.raises(ScheduleConflict, match="already exists"):
        add_schedule(cron_app, "ping", **GOOD)
    update_schedule(cron_app, "ping", cron="*/5 * * * *", timezone="Europe/Berlin")
    task = all_tasks(cron_app, store)["ping"]
    assert (task.spec, task.timezone, task.window_length) == (
        "*/5 * * * *",
        "Europe/Berlin",
        60 * SEC,
    )
    assert task.grace == 5 * SEC  # untouched fields keep their values
    pause_schedule(cron_app, "ping")
    assert "ping" not in all_tasks(cron_app, store)
    (row,) = [row for row in CronService(cron_app).rows() if row.id == "ping"]
    assert (row.source, row.paused, row.next_fire) == ("runtime", True, None)
    resume_schedule(cron_app, "ping")
    assert "ping" in all_tasks(cron_app, store)
    remove_schedule(cron_app, "ping")
    assert "ping" not in all_tasks(cron_app, store)
    assert [k for k in _runtime_keys(r) if k != KEYS.cron_runtime_version()] == []
    with pytest.raises(ScheduleConflict, match="no runtime schedule 'ping'"):
        remove_schedule(cron_app, "ping")


def test_a_runtime_schedule_may_not_shadow_a_code_task(cron_app, r):
    cron("* * * * *", app=cron_app, id="nightly", name="proj.nightly")(_noop)
    cron_app.conf.beat_schedule = {"ping-20s": {"task": "proj.ping", "schedule": 20.0}}
    with pytest.raises(ScheduleConflict, match="'nightly' is already declared in code by @cron"):
        add_schedule(cron_app, "nightly", **GOOD)
    with pytest.raises(ScheduleConflict, match=r"'ping-20s'.*beat_schedule entry"):
        add_schedule(cron_app, "ping-20s", **GOOD)
    assert _runtime_keys(r) == []


def test_a_running_beat_sees_add_and_rm_at_its_next_tick(cron_app, broker_url, r, monkeypatch):
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [])
    cron_app.conf.result_expires = None
    at = [T0 + SEC]
    beats = [CronScheduler(app=cron_app, clock=lambda: at[0], max_interval=300) for _ in range(2)]
    for beat in beats:
        beat.tick()
    add_schedule(cron_app, "ping", task="proj.ping", every="20s", remote_task=True)
    wid = "%Y-%m-%dT%H:%M:%SZ"
    for step in (2, 21, 22, 41, 42):  # each beat ticks at each instant
        at[0] = T0 + step * SEC
        for beat in beats:
            beat.tick()
        end_runs(r)
    counts = {w: n for (t, _, w), n in sends(broker_url).items() if t == "ping"}
    # first seen by a beat at T0+2s, as Celery's beat sees a new entry: every 20 s from then,
    # nothing at once, once each across the two beats
    assert counts == {(T0 + (2 + k * 20) * SEC).strftime(wid): 1 for k in (1, 2)}
    remove_schedule(cron_app, "ping")
    at[0] = T0 + 62 * SEC
    for beat in beats:
        beat.tick()
    counts = {w: n for (t, _, w), n in sends(broker_url).items() if t == "ping"}
    assert (T0 + 62 * SEC).strftime(wid) not in counts
    for beat in beats:
        beat.close()


def test_a_beat_on_the_real_clock_watches_for_changes_at_most_every_gap(cron_app, r, monkeypatch):
    """Beat's loop wakes for the check dispatcher as often as a job enters its lead; the reads
    that watch for a changed runtime schedule and for claims to take over run at most every
    CRON_WATCH_GAP_S of them, and a change is still seen within one gap."""
    beat = CronScheduler(app=cron_app, max_interval=300)  # the real clock: paced
    reads: list[float] = []
    version = beat.runtime.version

    def read_version():
        reads.append(time.monotonic())
        return version()

    monkeypatch.setattr(beat.runtime, "version", read_version)
    start, passes = time.monotonic(), 0
    while time.monotonic() - start < 1.0:
        beat._tick()
        passes += 1
    assert passes >= 20, passes  # woken far more often than the gap
    gaps = [b - a for a, b in itertools.pairwise(reads)]  # stamped just after each decision
    assert 3 <= len(reads) <= 5 and min(gaps) > scheduler_module.CRON_WATCH_GAP_S - 0.01, reads
    add_schedule(cron_app, "ping", task="proj.ping", every="20s", remote_task=True)
    deadline = time.monotonic() + 3 * scheduler_module.CRON_WATCH_GAP_S
    while "ping" not in {t.id for t in beat.engine.tasks} and time.monotonic() < deadline:
        beat._tick()
    assert "ping" in {t.id for t in beat.engine.tasks}
    beat.close()


def run_cli(*args: str):
    return run_module(
        "celery_app.cli", "-A", "celery_app", "schedule", *args, cwd=ROOT, pythonpath=[ROOT]
    )


def test_the_cli_adds_lists_and_refuses_a_bad_field_naming_its_flag(r):
    bad = run_cli(
        "add", "ping", "--task", "proj.ping", "--remote-task", "--every", "20s", "--kwargs", "[1]"
    )
    assert bad.returncode == 2
    assert "--kwargs: must be a JSON object" in bad.stderr
    slow = run_cli(
        "add", "ping", "--task", "proj.ping", "--remote-task", "--every", "20s",
        "--timeout", "30s", "--expected-duration", "1m",
    )  # fmt: skip
    assert slow.returncode == 2 and slow.stdout == ""
    assert slow.stderr.splitlines() == [
        "Error: --expected-duration: must be more than 0 and at most the timeout (30s), got '1m'"
    ]
    assert _runtime_keys(r) == []
    good = run_cli(
        "add", "ping", "--task", "proj.ping", "--remote-task", "--every", "20s",
        "--overlap", "allow",
    )  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert "added ping: proj.ping every 20 seconds" in good.stdout
    listed = run_cli("list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("ping ")]
    assert row.split()[1:3] == ["runtime", "every"]
    assert "allow" in row.split()
    assert good.stderr == ""  # asked for: nothing to say
    # no live worker records runs here: skip is warned about in one line, at update too
    skip = run_cli("update", "ping", "--overlap", "skip")
    assert skip.returncode == 0, skip.stderr
    assert skip.stderr.startswith("warning: overlap=skip needs workers that record cron runs")
    assert len(skip.stderr.splitlines()) == 1
    r.hset(KEYS.cron_recorders(), "celery@w1", time.time())  # a recording worker is live
    quiet = run_cli("update", "ping", "--overlap", "skip")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert run_cli("rm", "ping").returncode == 0
    missing = run_cli("rm", "ping")
    assert missing.returncode == 1 and "no runtime schedule 'ping'" in missing.stderr


def test_pause_and_resume_a_cron_and_a_beat_schedule_task_seen_by_every_beat_at_its_next_tick(
    cron_app, broker_url, r, monkeypatch
):
    """An override in Redis: both beats drop the paused tasks at their next tick and fire them
    again after resume; the windows of the pause are no gap; an unknown id writes nothing."""
    monkeypatch.setattr(scheduler_module, "build_drivers", lambda app: [])
    cron("* * * * *", app=cron_app, id="nightly", name="proj.nightly")(_noop)
    cron_app.conf.beat_schedule = {"ping-20s": {"task": "proj.ping", "schedule": 20.0}}
    at = [T0 + SEC]
    clock = lambda: at[0]  # noqa: E731
    beats = [CronScheduler(app=cron_app, clock=clock, max_interval=300) for _ in range(2)]
    for beat in beats:
        beat.tick()
    with pytest.raises(ScheduleConflict, match="no scheduled task 'nope'"):
        pause_schedule(cron_app, "nope")
    assert r.smembers(KEYS.cron_paused()) == set()
    assert "nightly" in pause_schedule(cron_app, "nightly").what  # @cron proj.nightly
    assert "beat_schedule entry 'ping-20s'" in pause_schedule(cron_app, "ping-20s").what
    rows = {row.id: row for row in CronService(cron_app, clock=clock).rows()}
    assert rows["nightly"].paused and rows["ping-20s"].paused
    assert rows["nightly"].next_fire is None
    for step in range(21, 181, 20):  # three minutes paused
        at[0] = T0 + step * SEC
        for beat in beats:
            beat.tick()
        end_runs(r)
    # a first deployment fires nothing at start, and nothing fires while paused
    assert sends(broker_url) == {}
    resume_schedule(cron_app, "nightly", now=at[0])
    resume_schedule(cron_app, "ping-20s", now=at[0])
    at[0] = T0 + 181 * SEC
    for beat in beats:
        beat.tick()
    end_runs(r)
    at[0] = T0 + 201 * SEC
    for beat in beats:
        beat.tick()
    counts = sends(broker_url)
    # the interval keeps the phase of its first sight (T0 + 1 s): every window after the resume
    ping = [(T0 + s * SEC).strftime("%Y-%m-%dT%H:%M:%SZ") for s in (181, 201)]
    assert counts == {
        ("nightly", "-", window_id(T0 + 3 * MIN)): 1,
        ("ping-20s", "-", ping[0]): 1,
        ("ping-20s", "-", ping[1]): 1,
    }
    findings = CronService(cron_app, clock=clock).diagnose()
    assert FindingKind.NOT_FIRED not in {f.kind for f in findings}, findings
    for beat in beats:
        beat.close()
