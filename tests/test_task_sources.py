"""Every source of tasks (``@cron``, ``beat_schedule``, ``add_periodic_task``) in one list, fired
by the engine with the same window keys: intervals in their own epoch-anchored windows,
per-task grace and overlap."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from celery.schedules import crontab, solar
from support.beat_entries import QUEUES, add_entries_with_options, message_shape
from support.cron import T0, end_runs, make_engine, sends

from celery_app.cron_tasks.registration import cron
from celery_app.cron_tasks.task_sources import DuplicateTaskId, all_tasks, id_for_entry_name
from celery_app.findings import FindingKind
from celery_app.redis.schema import CronSource, Keys

SEC = timedelta(seconds=1)


def _noop(*args, **kwargs) -> None: ...


def _project(app):
    app.conf.beat_schedule = {
        "nightly-report": {"task": "proj.report", "schedule": crontab(minute="*/2")},
        "ping-20s": {"task": "proj.ping", "schedule": timedelta(seconds=20), "args": (1,)},
    }
    app.conf.timezone = "UTC"

    app.conf.result_expires = None  # no celery.backend_cleanup entry: see its own test
    app.add_periodic_task(30.0, app.signature("proj.echo", ("x",)))

    cron("* * * * *", app=app, id="cron-task", name="proj.cron_task")(_noop)
    return app


def test_every_source_is_one_task_list_with_its_source(cron_app):
    tasks = all_tasks(_project(cron_app))
    by_source = {t.id: t.source for t in tasks.values()}
    echo_id = id_for_entry_name("proj.echo('x')")
    assert by_source == {
        "cron-task": CronSource.CRON,
        "nightly-report": CronSource.BEAT_SCHEDULE,
        "ping-20s": CronSource.BEAT_SCHEDULE,
        echo_id: CronSource.BEAT_SCHEDULE,
    }
    assert tasks[echo_id].label == "proj.echo('x')"
    assert tasks[echo_id].display_name == "proj.echo('x')"
    assert echo_id == id_for_entry_name("proj.echo('x')") != id_for_entry_name("proj.echo('y')")
    assert tasks["ping-20s"].window_length == timedelta(seconds=20)
    assert tasks["nightly-report"].window_length == timedelta(minutes=1)
    assert tasks["ping-20s"].window_id_of(T0 + 20 * SEC) == T0.strftime("%Y-%m-%dT%H:%M:20Z")
    assert tasks["nightly-report"].window_id_of(T0) == T0.strftime("%Y-%m-%dT%H:%MZ")


def test_celery_backend_cleanup_is_added_as_beat_adds_it_when_there_is_a_backend(
    cron_app, tmp_path
):
    cron_app.conf.result_expires = timedelta(days=1)
    assert "celery.backend_cleanup" not in all_tasks(cron_app)  # no backend: nothing to clean
    cron_app.conf.result_backend = f"file://{tmp_path}"
    task = all_tasks(cron_app)["celery.backend_cleanup"]
    assert (task.source, task.spec, task.options["expires"]) == (
        CronSource.BEAT_SCHEDULE,
        "crontab 0 4 * * *",
        12 * 3600,
    )


def test_a_duplicate_id_across_sources_names_both(cron_app):
    cron("* * * * *", app=cron_app, id="dup", name="proj.cron_dup")(_noop)
    cron_app.conf.beat_schedule = {"dup": {"task": "proj.other", "schedule": 60.0}}
    with pytest.raises(DuplicateTaskId, match=r"'dup'.*@cron proj.cron_dup.*'dup' \(task proj"):
        all_tasks(cron_app)


def test_a_solar_entry_is_a_task_asked_is_due_as_beat_asks_it(cron_app):
    cron_app.conf.beat_schedule = {"at-dawn": {"task": "proj.x", "schedule": _a_solar()}}
    task = all_tasks(cron_app)["at-dawn"]
    assert task.is_custom and not task.is_interval
    assert task.spec.startswith("celery.schedules.solar <solar: sunrise")


def test_interval_and_crontab_entries_fire_once_per_window_across_engines(cron_app, broker_url, r):
    _project(cron_app)
    engines = [make_engine(cron_app, owner=f"engine-{n}") for n in range(2)]
    echo_id = id_for_entry_name("proj.echo('x')")
    for step in range(0, 125, 5):  # two minutes and a bit, every 5 s, both engines
        at = T0 + step * SEC + timedelta(milliseconds=300)
        for engine in engines:
            engine.tick(at)
        end_runs(r)
    counts = sends(broker_url)
    assert set(counts.values()) == {1}, counts
    fired = sorted(counts)
    pings = [w for t, _, w in fired if t == "ping-20s"]
    assert pings == [(T0 + k * 20 * SEC).strftime("%Y-%m-%dT%H:%M:%SZ") for k in range(7)]
    echoes = [w for t, _, w in fired if t == echo_id]
    assert echoes == [(T0 + k * 30 * SEC).strftime("%Y-%m-%dT%H:%M:%SZ") for k in range(5)]
    reports = [w for t, _, w in fired if t == "nightly-report"]
    assert reports == [(T0 + k * 120 * SEC).strftime("%Y-%m-%dT%H:%MZ") for k in range(2)]
    crons = [w for t, _, w in fired if t == "cron-task"]
    assert len(crons) == 3


def test_overlap_allow_fires_while_the_previous_run_is_in_flight(cron_app, broker_url, r):
    cron("* * * * *", app=cron_app, id="skips", name="t.skips")(_noop)
    cron_app.conf.beat_schedule = {"allows": {"task": "t.allows", "schedule": 60.0}}
    engine = make_engine(cron_app)
    allows = next(t for t in engine.tasks if t.id == "allows")
    engine.set_tasks(
        [t if t.id != "allows" else _replace(allows, overlap="allow") for t in engine.tasks],
        T0,
    )
    for k in range(3):  # nobody finishes a run: in-flight keys stay
        engine.tick(T0 + k * 60 * SEC + SEC)
    counts = sends(broker_url)
    assert sum(n for (t, _, _), n in counts.items() if t == "allows") == 3
    assert sum(n for (t, _, _), n in counts.items() if t == "skips") == 1
    assert r.exists(Keys("cbtest").cron_inflight("skips", "-"))
    # claimed in one call, a crontab's and a 60 s interval's windows keep their own ids
    assert {w for (t, _, w) in counts if t == "allows"} == {
        (T0 + k * 60 * SEC).strftime("%Y-%m-%dT%H:%M:%SZ") for k in range(3)
    }
    assert ("skips", "-", T0.strftime("%Y-%m-%dT%H:%MZ")) in counts
    keys = Keys("cbtest")
    assert r.exists(keys.cron_window("skips", "-", T0.strftime("%Y-%m-%dT%H:%MZ")))
    assert r.exists(keys.cron_window("allows", "-", T0.strftime("%Y-%m-%dT%H:%M:%SZ")))


def test_grace_is_per_task(cron_app, broker_url, r):
    cron_app.conf.beat_schedule = {
        "strict": {"task": "t.strict", "schedule": 60.0},
        "lenient": {"task": "t.lenient", "schedule": 60.0},
    }
    engine = make_engine(cron_app)
    engine.set_tasks(
        [
            _replace(t, grace=timedelta(0) if t.id == "strict" else timedelta(seconds=90))
            for t in engine.tasks
        ],
        T0,
    )
    report = engine.tick(T0 + 100 * SEC)  # window T0 ended 40 s ago
    reasons = {(s.task_id, s.window): s.reason for s in report.skipped}
    # strict: past its grace, so missed; lenient: still in grace, only superseded by T0+1min
    assert reasons[("strict", T0)] == "missed"
    assert reasons[("lenient", T0)] == "superseded"


def test_set_tasks_keeps_unchanged_tasks_and_starts_new_ones(cron_app, broker_url, r):
    cron_app.conf.result_expires = None
    cron("* * * * *", app=cron_app, id="kept", name="t.kept")(_noop)
    engine = make_engine(cron_app)
    engine.tick(T0 + SEC)
    (kept,) = engine.tasks
    before = list(engine._heap)
    new = _replace(kept, id="added", name="t.added")
    engine.set_tasks([kept, new], T0 + 2 * SEC)
    assert before == [(before[0][0], 0)]
    assert before[0] in engine._heap
    end_runs(r)
    engine.tick(T0 + 61 * SEC)
    counts = sends(broker_url)
    assert counts[("kept", "-", T0.strftime("%Y-%m-%dT%H:%MZ"))] == 1
    assert counts[("added", "-", (T0 + 60 * SEC).strftime("%Y-%m-%dT%H:%MZ"))] == 1
    engine.set_tasks([new], T0 + 62 * SEC)
    end_runs(r)
    engine.tick(T0 + 121 * SEC)
    assert not any(
        t == "kept" and n
        for (t, _, w), n in sends(broker_url).items()
        if w == (T0 + 120 * SEC).strftime("%Y-%m-%dT%H:%MZ")
    )


def _a_solar() -> solar:
    """A solar schedule without the ephem library (which solar() needs to be built)."""
    value = solar.__new__(solar)
    value.event, value.lat, value.lon = "sunrise", 48.1, 11.6
    return value


def _replace(task, **changes):
    from dataclasses import replace

    return replace(task, **changes)


def test_beat_entries_are_sent_as_celerys_beat_sends_them_plus_the_cron_headers(
    cron_app, r, broker_url
):
    """The same entries sent by Celery's beat (Scheduler.apply_async) and by the engine's
    publisher land on the same queues with the same args, kwargs, options and routing; ours
    also carry the cron headers the worker records the run with."""
    from celery.beat import Scheduler

    from celery_app.cron_tasks.cron_state import FireRequest
    from celery_app.cron_tasks.sender import CronPublisher

    app = cron_app
    app.conf.result_expires = None
    add_entries_with_options(app)
    with app.connection_for_write() as conn:
        for queue in app.conf.task_queues:
            queue(conn.default_channel).declare()
    celery_beat = Scheduler(app)
    with app.producer_or_acquire() as producer:
        for name in sorted(app.conf.beat_schedule):
            celery_beat.apply_async(celery_beat.schedule[name], producer=producer, advance=False)
    tasks = all_tasks(app)
    publisher = CronPublisher(app, timedelta(seconds=60))
    window = T0 + 20 * SEC
    publisher.publish([FireRequest(tasks[n], "-", window) for n in sorted(tasks)])
    publisher.close()

    with app.connection_for_read() as conn:
        for queue_name in QUEUES:
            queue = conn.SimpleQueue(queue_name, no_ack=True)
            beats, ours = queue.get(timeout=1), queue.get(timeout=1)
            assert message_shape(beats) == message_shape(ours), queue_name
            assert "cron_task" not in beats.headers
            assert ours.headers["cron_window"] == window.strftime("%Y-%m-%dT%H:%M:%SZ")
            assert ours.headers["timelimit"] == beats.headers["timelimit"]  # none of ours
            queue.close()
            assert redis.Redis.from_url(broker_url).llen(queue_name) == 0


def test_run_now_list_and_diagnose_cover_every_source(cron_app, broker_url, r):
    from support.cron import store_of

    from celery_app.cron_tasks.runtime import add_schedule
    from celery_app.cron_tasks.service import CronService

    _project(cron_app)
    add_schedule(cron_app, "rt-ping", task="proj.rt", every="15s", grace="10s", remote_task=True)
    service = CronService(cron_app, clock=lambda: T0 + 25 * SEC)
    rows = {row.id: row for row in service.rows()}
    echo_id = id_for_entry_name("proj.echo('x')")
    assert {i: (rows[i].source, rows[i].grace_s, rows[i].overlap) for i in rows} == {
        "cron-task": ("@cron", 60.0, "skip"),
        "nightly-report": ("beat_schedule", 60.0, "allow"),  # as Celery's beat sends
        "ping-20s": ("beat_schedule", 60.0, "allow"),
        echo_id: ("beat_schedule", 60.0, "allow"),
        "rt-ping": ("runtime", 10.0, "skip"),
    }
    assert rows[echo_id].name == "proj.echo('x')"
    # seen 10 minutes ago, never fired: every source is overdue
    store_of(cron_app).note_first_seen(list(service.tasks.values()), T0 - 600 * SEC)
    findings = service.diagnose(now=T0 + 25 * SEC)
    overdue = {f.subject for f in findings if f.kind == FindingKind.OVERDUE}
    assert overdue == set(rows)
    for task_id, window in (
        ("ping-20s", "00:00:20Z"),
        ("rt-ping", "00:00:15Z"),
        (echo_id, "00:00:00Z"),
    ):
        first = service.run_now(task_id)
        assert first.sent and first.window == T0.strftime(f"%Y-%m-%dT{window}"), first
        again = service.run_now(task_id)
        assert not again.sent and "already fired" in again.message
    assert sends(broker_url)[("ping-20s", "-", T0.strftime("%Y-%m-%dT00:00:20Z"))] == 1


def test_list_shows_the_time_limit_a_run_gets_and_next_to_the_second(cron_app, r):
    """TIMEOUT is what a run is limited to: a @cron or runtime task's timeout (its messages
    carry it); for a beat_schedule entry what Celery applies, as under its own beat (the
    entry's options, else the task's limits from task_time_limit), none when nothing does.
    NEXT keeps its seconds where a minute would hide them."""
    from celery_app.cron_tasks.runtime import add_schedule
    from celery_app.cron_tasks.service import CronService

    _project(cron_app)
    cron_app.conf.beat_schedule["limited"] = {
        "task": "proj.limited", "schedule": 10.0, "options": {"soft_time_limit": 42},
    }  # fmt: skip
    add_schedule(cron_app, "rt-ping", task="proj.rt", every="15s", timeout="90s", remote_task=True)
    at = T0 + 25 * SEC
    rows = {row.id: row for row in CronService(cron_app, clock=lambda: at).rows()}
    assert rows["cron-task"].timeout_s == 300 and rows["rt-ping"].timeout_s == 90
    assert rows["ping-20s"].timeout_s is None and rows["nightly-report"].timeout_s is None
    assert rows["limited"].timeout_s == 42
    assert rows["ping-20s"].next_fire == (T0 + 40 * SEC).isoformat(timespec="seconds")
    assert rows["limited"].next_fire == (T0 + 30 * SEC).isoformat(timespec="seconds")
    # whole minutes stay minutes
    assert rows["cron-task"].next_fire == (T0 + 60 * SEC).isoformat(timespec="minutes")
    cron_app.conf.task_time_limit = 1800  # Celery's own limit, for every task of the app
    rows = {row.id: row for row in CronService(cron_app, clock=lambda: at).rows()}
    assert rows["ping-20s"].timeout_s == 1800 and rows["cron-task"].timeout_s == 300


def test_grace_and_overlap_are_declared_for_cron_and_beat_schedule_tasks(cron_app):
    from celery_app.cron_tasks.registration import CronSpecError
    from celery_app.cron_tasks.task_sources import beat_policy

    cron_app.conf.result_expires = None
    cron(
        "* * * * *", app=cron_app, id="c", name="t.c", grace=timedelta(seconds=5), overlap="allow"
    )(_noop)
    cron_app.conf.beat_schedule = {"b": {"task": "t.b", "schedule": 20.0}}
    assert all_tasks(cron_app)["b"].overlap == "allow"  # the default of an entry
    beat_policy(cron_app, "b", grace=timedelta(0), overlap="skip")
    tasks = all_tasks(cron_app)
    assert (tasks["c"].grace, tasks["c"].overlap) == (5 * SEC, "allow")
    assert (tasks["b"].grace, tasks["b"].overlap) == (timedelta(0), "skip")
    with pytest.raises(CronSpecError, match="overlap must be one of skip, allow"):
        cron("* * * * *", app=cron_app, id="d", name="t.d", overlap="maybe")(_noop)
    with pytest.raises(CronSpecError, match="grace must be a timedelta"):
        beat_policy(cron_app, "b", grace=timedelta(seconds=-1))
    beat_policy(cron_app, "typo", grace=timedelta(0))
    with pytest.raises(CronSpecError, match="beat_policy for 'typo': no beat_schedule entry"):
        all_tasks(cron_app)
