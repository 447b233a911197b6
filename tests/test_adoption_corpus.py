"""A project moves from Celery's beat to checkbeat by one line, and nothing fires differently.

The corpus (:mod:`support.adoption`: a Django-style settings module with every kind of entry real
projects write, custom schedule classes included) runs twice over the same minutes of the test
clock, from a first deployment: under Celery's own ``celery.beat.Scheduler`` (one beat, its
``tick`` driven at each second), and under checkbeat's engine with three beats ticking the same
seconds, restarted half-way (a deployment in its steady state: each task has its state, the
windows around the restart must neither be lost nor fire again). The firings must be the same
(entry, instant) pairs from the first one on, and each window's message must be in the broker
exactly once.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta

import redis
from support.adoption import (
    FLAG,
    RecordingScheduler,
    Timeline,
    corpus_app,
    settings_module,
    timeline,
)
from support.cron import make_engine, sends, store_of

from celery_app.cron_tasks.service import CronService
from celery_app.cron_tasks.task_sources import all_tasks

QUEUES = ("celery", "reports")
#: The entries whose schedule has no fixed grid (asked is_due with the shared last run).
CUSTOM = {
    "relative-2m",
    "at-sunrise",
    "flag-driven-30s",
    "wrapped-every-3-min",
    "tz-aware-every-4-min",
}


def _flag(r: redis.Redis, line: Timeline, at: datetime) -> None:
    """The project's operator turns the flag-driven job on and off at the same instants in
    both runs."""
    r.set(FLAG, "on" if line.flag_on <= at < line.flag_off else "off")


def _plain(broker_url: str, redis_url: str, r: redis.Redis, line: Timeline) -> list[tuple]:
    clock = [line.start]
    app = corpus_app(settings_module(broker_url, redis_url, line), clock)
    _flag(r, line, line.start)
    beat = RecordingScheduler(app=app)  # a first start: every entry's last run is "now"
    for at in line.instants():
        clock[0] = at
        _flag(r, line, at)
        beat.tick_all()
    app.close()
    return sorted(beat.sent)


def _checkbeat(broker_url: str, redis_url: str, r: redis.Redis, line: Timeline) -> list[tuple]:
    """Three beats tick each second, a different one first; all restart half-way."""
    clock = [line.start]
    app = corpus_app(settings_module(broker_url, redis_url, line), clock)
    _flag(r, line, line.start)
    restart = line.start + timedelta(minutes=line.minutes // 2, seconds=23)

    def beats(at: datetime, tag: str) -> list:
        return [make_engine(app, start=at, owner=f"beat-{n}{tag}", seen=None) for n in range(3)]

    engines = beats(line.start, "")  # a first deployment: no task has any state yet
    fired: list[tuple] = []
    for step, at in enumerate(line.instants()):
        clock[0] = at
        _flag(r, line, at)
        if at == restart:  # every beat restarts (a deploy, a failover): state is in Redis
            engines = beats(at, "-restarted")
        for n in range(len(engines)):
            engine = engines[(step + n) % len(engines)]
            fired.extend((f.task_id, at) for f in engine.tick(at).fired)
    app.close()
    return sorted(fired)


def _checkbeat_racing(
    broker_url: str, redis_url: str, r: redis.Redis, line: Timeline
) -> list[tuple]:
    """Three beats in threads, released together at each second: their claims race."""
    clock = [line.start]
    app = corpus_app(settings_module(broker_url, redis_url, line), clock)
    instants = line.instants()
    engines = [make_engine(app, start=line.start, owner=f"racer-{n}", seen=None) for n in range(3)]
    step = [-1]

    def next_second() -> None:  # run by the barrier once all three arrived
        step[0] += 1
        clock[0] = instants[min(step[0], len(instants) - 1)]
        _flag(r, line, clock[0])

    barrier = threading.Barrier(len(engines), action=next_second)
    fired: list[tuple] = []
    errors: list[BaseException] = []

    def run(engine) -> None:
        try:
            for _ in instants:
                barrier.wait(timeout=20)
                at = clock[0]
                fired.extend((f.task_id, at) for f in engine.tick(at).fired)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    app.close()
    assert not errors, errors
    return sorted(fired)


def test_the_corpus_holds_every_kind_of_entry(broker_url, redis_url, r):
    line = timeline()
    app = corpus_app(settings_module(broker_url, redis_url, line), [line.start])
    tasks = all_tasks(app)
    assert {t for t, task in tasks.items() if task.is_custom} == CUSTOM
    assert {t for t, task in tasks.items() if task.is_interval} == {
        "heartbeat-20s",
        "sync-90s",
        "schedule-2m",
    }
    assert tasks["digest-every-2-min"].options["queue"] == "reports"
    # what `schedule list` shows of them
    rows = {row.id: row for row in CronService(app).rows()}
    assert set(rows) == set(tasks)
    assert rows["at-sunrise"].spec.startswith("celery.schedules.solar <solar: sunrise")
    assert rows["flag-driven-30s"].spec.endswith("<flag proj:flag:sync every 0:00:30>")
    assert rows["heartbeat-20s"].spec == "every 20 seconds"
    # a run-now of a custom schedule is a window of its own: the shared last run stays
    engine = make_engine(app, start=line.start, seen=None)
    engine.tick(line.start)
    # once a beat has seen them, list says when each is next due, from the shared last run
    shown = {row.id: row.next_fire for row in CronService(app).rows()}
    relative_next = (line.start + timedelta(minutes=2)).replace(second=0)  # to its minute
    assert shown["relative-2m"] == relative_next.isoformat(timespec="minutes")
    assert shown["at-sunrise"] is not None and shown["flag-driven-30s"] is not None
    store = store_of(app)
    ref_key = store.keys.cron_ref("at-sunrise", tasks["at-sunrise"].fingerprint)
    before = r.get(ref_key)
    assert before is not None
    sent = CronService(app, clock=lambda: line.start + timedelta(seconds=5)).run_now("at-sunrise")
    assert sent.sent, sent
    assert r.get(ref_key) == before
    app.close()


def test_first_deploy_and_steady_state_fire_as_celery_beat_exactly_once(broker_url, redis_url, r):
    line = timeline()
    redis.Redis.from_url(broker_url).flushdb()
    expected = _plain(broker_url, redis_url, r, line)
    got = _checkbeat(broker_url, redis_url, r, line)
    by_entry = Counter(name for name, _ in expected)
    # every kind fired in the timeline, the one entry of another day did not
    assert set(by_entry) == {
        "digest-every-2-min",
        "at-two-minutes",
        "heartbeat-20s",
        "sync-90s",
        "schedule-2m",
        *CUSTOM,
    }, by_entry
    # nothing at the first instant (a first deployment fires nothing stale) ...
    assert all(at > line.start for _, at in expected)
    # ... and from the first firing on, the same (entry, instant) pairs
    assert got == expected
    # exactly once: one message per window, as many as firings, through the real publisher
    messages = sends(broker_url, QUEUES)
    assert set(messages.values()) == {1}, messages
    assert sum(messages.values()) == len(got)


def test_three_racing_beats_fire_each_window_once_as_celery_beat(broker_url, redis_url, r):
    line = timeline(minutes=4)
    redis.Redis.from_url(broker_url).flushdb()
    expected = _plain(broker_url, redis_url, r, line)
    assert {name for name, _ in expected} >= CUSTOM - {"tz-aware-every-4-min"}
    assert _checkbeat_racing(broker_url, redis_url, r, line) == expected
    messages = sends(broker_url, QUEUES)
    assert set(messages.values()) == {1}, messages
    assert sum(messages.values()) == len(expected)
