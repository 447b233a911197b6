"""Beat benchmark: one window of due cron tasks; checkbeat vs redbeat vs PersistentScheduler.

Reproduce (from the repository root; ~1 minute; needs only the venv, it starts its own
redis-server):

    /work/venv/bin/python -m bench.beat_bench            # 10,000 checkbeat tasks
    /work/venv/bin/python -m bench.beat_bench --quick    # smoke run (what the test suite runs)

What is timed, each through a real Redis broker (messages counted in the broker afterwards):

* checkbeat: ``CronEngine.tick`` of one window in which all N singleton tasks are due: the
  per-window keys for all of them (one pipelined round trip of Lua calls), the publish (one
  pipeline of multi-value LPUSHes) and the confirmation. The first window also pays the
  engine's one-time start-up bookkeeping; the steady-state row is the second window. The
  process is set up as a beat sets itself up once its tasks are loaded
  (``beat.cron_engine.settle_long_lived``).
* checkbeat mixed sources: the same, with N tasks of four sources due in one window: a quarter
  each of ``@cron`` tasks, ``beat_schedule`` ``crontab()`` entries, ``beat_schedule``
  60 s interval entries (with args) and runtime schedules (``every=60s``, in Redis, loaded
  the way a beat loads them). Steady window, as above.
* checkbeat quiet tick: ``CronEngine.tick`` with nothing due and N tasks registered (mean).
* celery-redbeat: ``RedBeatScheduler.tick`` with ``crontab()`` entries all due at once,
  repeated until every entry is published (capped at ``--redbeat`` entries).
* Celery ``PersistentScheduler``: ``tick`` (one entry per call, as beat does) with ``crontab()``
  entries all due, until all are published (capped at ``--persistent`` entries).

The baselines run fewer entries because they are slow; the table compares rates (entries
per second), measured in the same run on the same Redis.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from bench.figures import command_line
from celery_app.local.embedded_redis import RedisServer

BROKER_DB, STATE_DB, REDBEAT_DB = 0, 1, 2


def _noop() -> None: ...


T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _bench_app(server: RedisServer):
    """A checkbeat app on the bench's Redis, with its own key prefix."""
    from celery_app.factory import create_app
    from celery_app.settings import load_settings

    settings = load_settings(
        redis_url=server.url(STATE_DB), broker_url=server.url(BROKER_DB), key_prefix="bench"
    )
    return create_app(settings), settings


def _engine(app, settings, declared: list, owner: str):
    """A cron engine over ``declared`` whose clock stands still at ``T0`` (ticks pass ``at``)."""
    from beat.cron_engine import CronEngine, settle_long_lived
    from celery_app.cron_tasks.cron_state import CronStore
    from celery_app.cron_tasks.sender import CronPublisher
    from celery_app.cron_tasks.tenants_provider import resolve_tenants
    from celery_app.redis.client import get_redis
    from celery_app.redis.schema import Keys

    store = CronStore(get_redis(settings.redis_url, settings), Keys("bench"), settings.cron_grace)
    # A deployment in its steady state: the tasks were first seen a day ago, so T0's window is
    # theirs to fire (a first deployment fires nothing before its next window).
    store.note_refs(declared, T0 - timedelta(days=1))
    publisher = CronPublisher(app, settings.cron_grace)
    publisher.prepare(declared)
    engine = CronEngine(
        declared,
        store,
        publisher,
        resolve_tenants(app),
        grace=settings.cron_grace,
        owner=owner,
        start=T0,
        clock=lambda: T0,
    )
    settle_long_lived()  # as the beat does once its tasks are loaded
    return engine


def _time_windows(server: RedisServer, engine, tasks: int) -> list[float]:
    """Seconds of the first and the second window's tick, each firing all ``tasks`` (checked
    against the broker's queue length)."""
    from celery_app.redis.schema import Keys

    broker = redis.Redis.from_url(server.url(BROKER_DB))
    state = redis.Redis.from_url(server.url(STATE_DB))
    elapsed = []
    for minute in (0, 1):
        for key in state.scan_iter(Keys("bench").cron_inflight("*", "*"), count=5000):
            state.delete(key)  # the previous window's runs ended
        broker.delete("celery")
        at = T0 + timedelta(minutes=minute, seconds=1)
        start = time.perf_counter()
        report = engine.tick(at)
        elapsed.append(time.perf_counter() - start)
        published = broker.llen("celery")
        assert len(report.fired) == tasks == published, (len(report.fired), published)
    return elapsed


def _flush(server: RedisServer) -> None:
    redis.Redis.from_url(server.url(BROKER_DB)).flushdb()
    redis.Redis.from_url(server.url(STATE_DB)).flushdb()


def bench_checkbeat(server: RedisServer, tasks: int, quiet_ticks: int) -> dict[str, float]:
    from celery_app.cron_tasks.registration import cron, cron_tasks

    app, settings = _bench_app(server)
    for i in range(tasks):
        cron("* * * * *", app=app, id=f"task-{i}", name=f"bench.task{i}")(_noop)
    engine = _engine(app, settings, list(cron_tasks(app).values()), "bench")
    first, steady = _time_windows(server, engine, tasks)
    results: dict[str, float] = {"first_s": first, "steady_s": steady}
    quiet_at = T0 + timedelta(minutes=1, seconds=30)
    samples = []
    for _ in range(quiet_ticks):
        start = time.perf_counter()
        engine.tick(quiet_at)
        samples.append(time.perf_counter() - start)
    results["quiet_mean_us"] = statistics.fmean(samples) * 1e6
    results["quiet_p99_us"] = sorted(samples)[int(len(samples) * 0.99) - 1] * 1e6
    _flush(server)
    return results


def bench_mixed(server: RedisServer, tasks: int) -> float:
    """Seconds of the steady window with ``tasks`` due tasks of every source."""
    from celery.schedules import crontab

    from celery_app.cron_tasks.registration import cron
    from celery_app.cron_tasks.runtime import RuntimeStore, validate_schedule
    from celery_app.cron_tasks.task_sources import all_tasks
    from celery_app.redis.client import get_redis
    from celery_app.redis.schema import CronSource, Keys

    app, settings = _bench_app(server)
    app.conf.result_expires = None  # no celery.backend_cleanup entry in the count
    quarter = tasks // 4
    for i in range(tasks - 3 * quarter):
        cron("* * * * *", app=app, id=f"cron-{i}", name=f"bench.cron{i}")(_noop)
    schedule: dict[str, dict] = {}
    for i in range(quarter):
        schedule[f"crontab-{i}"] = {"task": f"bench.crontab{i}", "schedule": crontab()}
        schedule[f"interval-{i}"] = {
            "task": f"bench.interval{i}",
            "schedule": timedelta(seconds=60),
            "args": (i,),
        }
    app.conf.beat_schedule = schedule
    runtime = RuntimeStore(get_redis(settings.redis_url, settings), Keys("bench"))
    for i in range(quarter):
        entry = validate_schedule(f"runtime-{i}", task=f"bench.runtime{i}", every="60s")
        runtime.write(entry, create=True)
    declared = list(all_tasks(app, runtime).values())
    sources = {str(source): 0 for source in CronSource}
    for task in declared:
        sources[str(task.source)] += 1
    assert len(declared) == tasks, (len(declared), sources)
    _first, steady = _time_windows(server, _engine(app, settings, declared, "bench-mixed"), tasks)
    _flush(server)
    return steady


def bench_redbeat(server: RedisServer, entries: int) -> float:
    from celery import Celery
    from celery.schedules import crontab
    from redbeat import RedBeatScheduler
    from redbeat.schedulers import RedBeatSchedulerEntry

    app = Celery("redbeat-bench", broker=server.url(BROKER_DB), set_as_current=False)
    app.conf.update(
        redbeat_redis_url=server.url(REDBEAT_DB),
        task_serializer="json",
        accept_content=["json"],
        beat_max_loop_interval=300,
    )
    past = datetime.now(UTC) - timedelta(minutes=5)
    scheduler = RedBeatScheduler(app=app, lazy=True)
    scheduler.lock_key = None  # one beat, no lock: measure only the firing
    scheduler.setup_schedule()
    for i in range(entries):
        RedBeatSchedulerEntry(
            f"entry-{i}", "bench.noop", crontab(), last_run_at=past, app=app
        ).save()
    broker = redis.Redis.from_url(server.url(BROKER_DB))
    broker.delete("celery")
    start = time.perf_counter()
    while broker.llen("celery") < entries:
        scheduler.tick()
    elapsed = time.perf_counter() - start
    redis.Redis.from_url(server.url(REDBEAT_DB)).flushdb()
    broker.flushdb()
    return elapsed


def bench_persistent(server: RedisServer, entries: int) -> float:
    from celery import Celery
    from celery.beat import PersistentScheduler
    from celery.schedules import crontab

    app = Celery("persistent-bench", broker=server.url(BROKER_DB), set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        beat_schedule={
            f"entry-{i}": {"task": "bench.noop", "schedule": crontab()} for i in range(entries)
        },
    )
    schedule_file = Path(tempfile.mkdtemp(prefix="beat-bench-")) / "celerybeat-schedule"
    scheduler = PersistentScheduler(app=app, schedule_filename=str(schedule_file))
    past = app.now() - timedelta(minutes=5)
    for entry in scheduler.schedule.values():
        entry.last_run_at = past
    broker = redis.Redis.from_url(server.url(BROKER_DB))
    broker.delete("celery")
    start = time.perf_counter()
    while broker.llen("celery") < entries:
        scheduler.tick()
    elapsed = time.perf_counter() - start
    scheduler.close()
    broker.flushdb()
    return elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--tasks", type=int, default=10_000, help="checkbeat tasks in a window")
    parser.add_argument("--redbeat", type=int, default=2_000, help="redbeat entries (capped)")
    parser.add_argument("--persistent", type=int, default=300, help="PersistentScheduler entries")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.redbeat, args.persistent = 300, 50, 10
    quiet_ticks = 2_000 if args.quick else 10_000

    os.environ.setdefault("CHECKBEAT_KEY_PREFIX", "bench")
    with tempfile.TemporaryDirectory(prefix="beat-bench-redis-") as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            cb = bench_checkbeat(server, args.tasks, quiet_ticks)
            mixed = bench_mixed(server, args.tasks)
            rb = bench_redbeat(server, args.redbeat)
            ps = bench_persistent(server, args.persistent)
        finally:
            server.stop()

    steady_rate = args.tasks / cb["steady_s"]
    rows = [
        ("checkbeat CronEngine, steady window", args.tasks, cb["steady_s"]),
        ("checkbeat CronEngine, first window*", args.tasks, cb["first_s"]),
        ("checkbeat CronEngine, mixed sources", args.tasks, mixed),
        ("celery-redbeat RedBeatScheduler", args.redbeat, rb),
        ("Celery PersistentScheduler", args.persistent, ps),
    ]
    print(f"\nFiring one window of due entries through a real Redis broker ({sys.platform})\n")
    head = ("scheduler", "entries", "seconds", "fired/s", "vs checkbeat")
    print(f"| {head[0]:<38} | {head[1]:>7} | {head[2]:>8} | {head[3]:>9} | {head[4]:>12} |")
    print(f"|{'-' * 40}|{'-' * 9}|{'-' * 10}|{'-' * 11}|{'-' * 14}|")
    figures: dict[str, Any] = {"schedulers": {}}
    for name, count, seconds in rows:
        rate = count / seconds
        print(
            f"| {name:<38} | {count:>7,} | {seconds:>8.3f} | {rate:>9,.0f} | "
            f"{rate / steady_rate:>11.3f}x |"
        )
        figures["schedulers"][name] = {
            "fired": count,  # each bench_* returns once its whole window is in the broker
            "seconds": seconds,
            "fired per s": rate,
            "vs checkbeat": rate / steady_rate,
        }
    print(
        f"\nquiet tick (nothing due, {args.tasks:,} tasks registered): "
        f"mean {cb['quiet_mean_us']:.1f} us, p99 {cb['quiet_p99_us']:.1f} us"
    )
    print(
        "* includes the engine's one-time start-up bookkeeping (first-seen marks, gap check).\n"
        "Baselines are capped (--redbeat, --persistent); compare the rates."
    )
    figures["quiet tick"] = {
        "tasks": args.tasks,
        "mean us": cb["quiet_mean_us"],
        "p99 us": cb["quiet_p99_us"],
    }
    return figures


if __name__ == "__main__":
    command_line(main)
