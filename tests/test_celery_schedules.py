"""beat_schedule entries as CronScheduler reads them: the same entries, times and sends as
Celery's own beat, or a refusal naming the entry.

The references are Celery's: ``celery.beat.PersistentScheduler`` (the default scheduler a
project replaces) for which entries exist and what they carry, ``ScheduleEntry`` for the
timezone a crontab is read in, ``Scheduler.apply_async`` on the in-memory transport for the
message a send produces, and ``schedule.is_due`` for interval spacing.
"""

from __future__ import annotations

import pickle
import random
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from celery import Celery, current_app
from celery.beat import BeatLazyFunc, PersistentScheduler, ScheduleEntry, Scheduler
from celery.schedules import crontab, schedule, solar
from celery.utils.time import timezone as celery_timezone
from support.beat_entries import QUEUES, add_entries_with_options, message_shape

from celery_app.cron_tasks.celery_schedules import (
    SUPPORTED,
    BeatEntryError,
    BeatEntryErrors,
    CustomSchedule,
    Interval,
    beat_entries,
    beat_entry,
    interval_window,
)
from scheduling_core.celery_crontab import CeleryCrontab, CeleryCrontabError


def make_app(**conf) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


def sets_of(c: crontab) -> tuple:
    return (c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year)


# -- the issue's project ---------------------------------------------------------------------------


def test_the_issues_project_fires_both_entries():
    """``proj`` with a crontab() entry and a timedelta(seconds=20) entry: both are read, none is
    dropped, and each fires when Celery's beat would."""
    app = make_app(timezone="Europe/Berlin")

    @app.task(name="proj.tasks.report", shared=False)
    def report():
        return None

    @app.task(name="proj.tasks.ping", shared=False)
    def ping():
        return None

    app.conf.beat_schedule = {
        "nightly-report": {"task": "proj.tasks.report", "schedule": crontab(minute=30, hour=2)},
        "ping": {"task": "proj.tasks.ping", "schedule": timedelta(seconds=20)},
    }
    app.conf.result_backend = "redis://127.0.0.1:1/0"  # results expire by themselves
    entries = {e.name: e for e in beat_entries(app)}
    assert set(entries) == {"nightly-report", "ping"}
    nightly = entries["nightly-report"]
    assert nightly.zone is ZoneInfo("Europe/Berlin")
    # spring forward: Celery reads 02:30 with the winter offset, i.e. 03:30 CEST
    at = datetime(2026, 3, 29, 0, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert nightly.next_fire(at) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    ping_entry = entries["ping"]
    assert ping_entry.schedule == Interval(timedelta(seconds=20))
    assert ping_entry.next_fire(datetime(2026, 3, 29, 0, 0, 7, tzinfo=UTC)) == datetime(
        2026, 3, 29, 0, 0, 20, tzinfo=UTC
    )


# -- which entries, and what they carry: as PersistentScheduler ------------------------------------


def test_entries_and_their_contents_are_persistent_schedulers(tmp_path):
    app = make_app(timezone="America/New_York")

    @app.task(name="proj.add", shared=False)
    def add(x, y):
        return x + y

    app.conf.beat_schedule = {
        "every-minute": {"task": "proj.add", "schedule": 60.0, "args": (1, 2)},
        "weekdays": {
            "task": "proj.add",
            "schedule": crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"),
            "args": [3],
            "kwargs": {"y": 4},
            "options": {"queue": "reports", "priority": 3, "expires": 60},
            "relative": True,  # ignored for a crontab, by Celery and by us
        },
        "hourly-td": {"task": "remote.task", "schedule": timedelta(hours=1)},
    }
    # PersistentScheduler's entries come back from its shelve without an app, so their
    # crontabs read the *current* app's timezone: under `celery -A proj beat` that is proj
    previous = current_app._get_current_object()
    app.set_current()
    try:
        celery_beat = PersistentScheduler(app, schedule_filename=str(tmp_path / "beat"))
        theirs = dict(celery_beat.schedule)
        for entry in theirs.values():
            entry.is_due()  # reads (and caches) each schedule's timezone, as beat's first tick
        celery_beat.close()
    finally:
        previous.set_current()
    ours = {e.name: e for e in beat_entries(app)}
    assert set(ours) == set(theirs)  # the three, and celery.backend_cleanup (no result backend)
    assert "celery.backend_cleanup" in ours
    for name, entry in theirs.items():
        mine = ours[name]
        assert mine.task == entry.task
        assert list(mine.args) == list(entry.args)
        assert dict(mine.kwargs) == dict(entry.kwargs)
        assert dict(mine.options) == dict(entry.options)
        if isinstance(entry.schedule, crontab):
            assert isinstance(mine.schedule, CeleryCrontab)
            assert mine.schedule == CeleryCrontab(*sets_of(entry.schedule))
            assert mine.zone is entry.schedule.tz
        else:
            assert mine.schedule == Interval(entry.schedule.run_every)


def test_include_defaults_false_leaves_celerys_cleanup_entry_out():
    app = make_app()
    app.conf.beat_schedule = {"a": {"task": "t", "schedule": 5}}
    assert [e.name for e in beat_entries(app, include_defaults=False)] == ["a"]
    assert {e.name for e in beat_entries(app)} == {"a", "celery.backend_cleanup"}
    cleanup = next(e for e in beat_entries(app) if e.name == "celery.backend_cleanup")
    assert cleanup.schedule == CeleryCrontab({0}, {4}, range(7), range(1, 32), range(1, 13))
    assert dict(cleanup.options) == {"expires": 12 * 3600}


def test_add_periodic_task_calls_all_land_in_beat_schedule():
    """Before configuration (pending), from on_after_configure and from on_after_finalize: every
    add_periodic_task call ends up in app.conf.beat_schedule, which beat_entries reads."""
    app = make_app()

    @app.task(name="proj.echo", shared=False)
    def echo(*args, **kwargs):
        return args

    @app.on_after_configure.connect
    def on_configure(sender, **_):
        sender.add_periodic_task(crontab(minute=0), echo.s("configured").set(queue="q1"))

    @app.on_after_finalize.connect
    def on_finalize(sender, **_):
        sender.add_periodic_task(
            timedelta(minutes=5), echo.s(), args=(1,), kwargs={"k": 2}, name="late", priority=7
        )

    assert not app.configured
    app.add_periodic_task(10.0, echo.s("early"), name="early")  # configures the app
    app.finalize()
    entries = {e.name: e for e in beat_entries(app, include_defaults=False)}
    unnamed = repr(echo.s("configured"))
    assert set(entries) == {"early", unnamed, "late"}
    assert entries["early"].args == ("early",)
    assert entries["early"].schedule == Interval(timedelta(seconds=10))
    assert dict(entries[unnamed].options) == {"queue": "q1"}
    assert entries["late"].args == (1,)
    assert dict(entries["late"].kwargs) == {"k": 2}
    assert dict(entries["late"].options) == {"priority": 7}


# -- the crontab's timezone ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"timezone": "Pacific/Chatham"}, ZoneInfo("Pacific/Chatham")),
        ({"timezone": "Asia/Kolkata", "enable_utc": False}, ZoneInfo("Asia/Kolkata")),
        ({"enable_utc": True}, ZoneInfo("UTC")),
        ({"enable_utc": False}, celery_timezone.local),
    ],
)
def test_a_crontab_is_read_in_the_zone_celerys_beat_reads_it_in(conf, expected):
    app = make_app(**conf)
    other = make_app(timezone="Asia/Tokyo")
    c = crontab(minute=0, hour=9, app=other)  # beat replaces the crontab's own app by its own
    theirs = ScheduleEntry(name="n", task="t", schedule=c, app=app).schedule.tz
    ours = beat_entry("n", {"task": "t", "schedule": crontab(minute=0, hour=9, app=other)}, app)
    assert theirs == expected
    assert ours.zone == expected


def test_a_crontab_whose_tz_was_read_already_keeps_it_as_in_celery():
    app, other = make_app(timezone="UTC"), make_app(timezone="Asia/Tokyo")
    c = crontab(minute=0, hour=9, app=other)
    assert c.tz == ZoneInfo("Asia/Tokyo")  # read (and cached) before beat sees it
    theirs = ScheduleEntry(name="n", task="t", schedule=c, app=app).schedule.tz
    assert theirs == ZoneInfo("Asia/Tokyo")
    assert beat_entry("n", {"task": "t", "schedule": c}, app).zone == ZoneInfo("Asia/Tokyo")


def test_celery_57_ignores_the_zone_of_nowfun_which_is_why_we_refuse_a_mismatch():
    """Celery 5.7 reads a crontab in the app's zone whatever zone ``nowfun`` returns (5.6 read
    it in nowfun's), so a nowfun in another zone makes the times depend on the version."""
    app = make_app(timezone="UTC")
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
    c = crontab(minute=0, hour=9, nowfun=lambda: now.astimezone(tokyo), app=app)
    assert c.remaining_estimate(now.astimezone(tokyo)) == timedelta(hours=1)  # 09:00 UTC
    with pytest.raises(BeatEntryError, match=r"'tokyo'.*Asia/Tokyo.*app's timezone UTC") as err:
        beat_entry(
            "tokyo",
            {
                "task": "t",
                "schedule": crontab(hour=9, nowfun=lambda: datetime.now(tokyo)),
            },
            app,
        )
    assert err.value.entry == "tokyo"


def test_a_nowfun_that_is_the_real_clock_is_accepted():
    app = make_app(timezone="Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    for nowfun in (lambda: datetime.now(berlin), lambda: datetime.now(UTC).replace(tzinfo=None)):
        found = beat_entry("n", {"task": "t", "schedule": crontab(nowfun=nowfun)}, app)
        assert found.zone is berlin


@pytest.mark.parametrize(
    "nowfun",
    [
        lambda: datetime(2020, 1, 1, tzinfo=UTC),  # a frozen clock
        lambda: datetime.now(UTC) + timedelta(hours=1),  # a shifted one
    ],
)
def test_a_nowfun_that_is_not_the_current_time_is_refused(nowfun):
    app = make_app()
    for value in (crontab(nowfun=nowfun), schedule(timedelta(seconds=5), nowfun=nowfun)):
        with pytest.raises(BeatEntryError, match=r"'clocky'.*nowfun returned.*current time"):
            beat_entry("clocky", {"task": "t", "schedule": value}, app)


# -- intervals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        timedelta(seconds=20),
        20,
        20.0,
        schedule(timedelta(seconds=20)),
        schedule(20),
    ],
    ids=["timedelta", "int", "float", "schedule(timedelta)", "schedule(number)"],
)
def test_every_interval_form_is_the_same_interval(value):
    entry = beat_entry("iv", {"task": "t", "schedule": value}, make_app())
    assert entry.schedule == Interval(timedelta(seconds=20))
    assert entry.zone is None
    assert entry.describe() == "every 20 seconds"


def test_interval_windows_are_anchored_at_the_epoch_and_every_beat_agrees():
    rng = random.Random(7)
    for every in (timedelta(seconds=1), timedelta(seconds=1.5), timedelta(seconds=20),
                  timedelta(minutes=7), timedelta(hours=5), timedelta(days=1)):  # fmt: skip
        interval = Interval(every)
        for _ in range(200):
            t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10**14))
            window = interval_window(t, every)
            assert window.start <= t < window.end and window.end - window.start == every
            epoch = datetime(1970, 1, 1, tzinfo=UTC)
            assert window.start == epoch + window.index * every
            # beats that look at any other instant of the window, in any zone, agree on it
            for zone in ("UTC", "Europe/Berlin", "Pacific/Chatham"):
                other = window.start + (window.end - window.start) * rng.random()
                assert interval_window(other.astimezone(ZoneInfo(zone)), every) == window
            assert interval.next(t) == (t if t == window.start else window.end)
            assert interval.next_after(t) == window.end
            assert interval.next(window.start) == window.start
            assert interval.matches(window.start) and not interval.matches(window.start + every / 2)
            assert interval_window(window.end, every).index == window.index + 1


def test_interval_spacing_is_celerys():
    """Celery's schedule is due exactly ``every`` after its last run; our windows are as long."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    for every in (timedelta(seconds=1), timedelta(seconds=1.5), timedelta(seconds=20)):
        s = schedule(every, nowfun=lambda: now[0])
        last = now[0]
        now[0] = last + every - timedelta(microseconds=1)
        assert not s.is_due(last).is_due
        now[0] = last + every
        assert s.is_due(last).is_due
        window = interval_window(last, every)
        assert window.end - window.start == every


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0.5, r"0\.5 seconds is shorter than 1 second"),
        (timedelta(milliseconds=999), r"0\.999 seconds is shorter than 1 second"),
        (0, r"0 seconds is shorter than 1 second"),
        (-5, r"-5 seconds is shorter than 1 second"),
        (schedule(0.25), r"0\.25 seconds is shorter than 1 second"),
        (float("nan"), r"nan is not a number of seconds"),
        (True, r"True is not a schedule"),
    ],
)
def test_bad_intervals_are_refused_naming_the_entry(value, message):
    with pytest.raises(
        BeatEntryError, match=rf"^beat_schedule entry 'fast': (an interval of )?{message}"
    ) as err:
        beat_entry("fast", {"task": "t", "schedule": value}, make_app())
    assert err.value.entry == "fast"
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "entry",
    [
        {"task": "t", "schedule": 30, "relative": True},
        {"task": "t", "schedule": timedelta(hours=1), "relative": True},
        {"task": "t", "schedule": schedule(timedelta(hours=1), relative=True)},
    ],
)
def test_relative_intervals_are_asked_is_due_as_beat_asks_them(entry):
    app = make_app()
    converted = beat_entry("rel", entry, app)
    assert isinstance(converted.schedule, CustomSchedule)
    value = converted.schedule.value
    assert type(value) is schedule and value.relative and value.app is app
    assert value.run_every in (timedelta(seconds=30), timedelta(hours=1))


# -- schedules without a fixed grid, and refused ones ----------------------------------------------


def a_solar() -> solar:
    """A solar schedule without the ephem library (which solar() needs to be built)."""
    value = solar.__new__(solar)
    value.event, value.lat, value.lon, value.nowfun, value._app = "sunrise", 52.5, 13.4, None, None
    return value


class MyCrontab(crontab):
    pass


class MySchedule(schedule):
    pass


class Every:
    def is_due(self, last_run_at):
        return False, 60


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (a_solar(), "celery.schedules.solar <solar: sunrise at latitude 52.5, longitude: 13.4>"),
        (MyCrontab(), "test_celery_schedules.MyCrontab <crontab: * * * * * (m/h/dM/MY/d)>"),
        (MySchedule(5), "test_celery_schedules.MySchedule <freq: 5.00 seconds>"),
    ],
)
def test_any_base_schedule_is_kept_as_itself_with_the_app_beat_gives_it(value, text):
    app = make_app()
    converted = beat_entry("sky", {"task": "t", "schedule": value}, app)
    assert isinstance(converted.schedule, CustomSchedule)
    assert converted.schedule.value is value and value.app is app
    assert converted.describe() == text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Every(), r"test_celery_schedules\.Every is not a schedule"),
        ("*/5 * * * *", r"builtins\.str is not a schedule"),
    ],
)
def test_unsupported_schedules_are_refused_naming_the_entry_and_what_is_supported(value, message):
    with pytest.raises(BeatEntryError, match=rf"^beat_schedule entry 'sky': {message}") as err:
        beat_entry("sky", {"task": "t", "schedule": value}, make_app())
    assert SUPPORTED in str(err.value)
    assert err.value.entry == "sky"


def test_one_refused_entry_fails_the_whole_read():
    app = make_app()
    app.conf.beat_schedule = {
        "fine": {"task": "t", "schedule": 10},
        "dawn": {"task": "t", "schedule": Every()},
    }
    with pytest.raises(BeatEntryError, match=r"^beat_schedule entry 'dawn': [^\n]*$"):
        beat_entries(app)


def test_every_refused_entry_is_named_at_once_one_line_each():
    app = make_app()
    app.conf.beat_schedule = {
        "fine": {"task": "t", "schedule": 10},
        **{f"bad-{n}": {"task": "t", "schedule": Every()} for n in range(6)},
        "no-task": {"schedule": 10},
    }
    with pytest.raises(BeatEntryErrors) as err:
        beat_entries(app)
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        *(f"beat_schedule entry 'bad-{n}'" for n in range(6)),
        "beat_schedule entry 'no-task'",
    ]
    assert isinstance(err.value, BeatEntryError)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"schedule": 10}, r"'task' must be a task name"),
        ({"task": "", "schedule": 10}, r"'task' must be a task name"),
        ({"task": "t"}, r"'schedule' is missing; supported: an instance of celery\.sched"),
        ({"task": "t", "schedule": 10, "last_run_at": datetime.now(UTC)}, r"'last_run_at'"),
        ({"task": "t", "schedule": 10, "every": 5}, r"unknown key 'every'; an entry has task,"),
        ({"task": "t", "schedule": 10, "args": "x"}, r"'args' must be a list or a tuple, got str"),
        ({"task": "t", "schedule": 10, "kwargs": [1]}, r"'kwargs' must be a dict"),
        ({"task": "t", "schedule": 10, "options": {"producer": 1}}, r"option 'producer' cannot"),
        ({"task": "t", "schedule": 10, "options": {1: 2}}, r"'options' keys must be strings"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry(entry, message):
    with pytest.raises(BeatEntryError, match=rf"^beat_schedule entry 'e': {message}"):
        beat_entry("e", entry, make_app())


def test_keys_celery_ignores_are_ignored():
    entry = {"task": "t", "schedule": 10, "name": "other", "app": None, "total_run_count": 3}
    assert beat_entry("e", entry, make_app()).name == "e"


class FixedButNotZoneInfo(tzinfo):
    def utcoffset(self, dt):
        return timedelta(0)


def test_a_timezone_that_is_not_zoneinfo_is_refused():
    c = crontab()
    c.tz = FixedButNotZoneInfo()  # e.g. Celery's LocalTimezone fallback
    with pytest.raises(BeatEntryError, match=r"'e': the crontab's timezone .* is not a zoneinfo"):
        beat_entry("e", {"task": "t", "schedule": c}, make_app())


# -- args, kwargs and options: what a send carries -------------------------------------------------


def test_sends_carry_what_celerys_beat_sends():
    """The same entries sent by Celery's beat (Scheduler.apply_async) and from our values (the
    way beat sends: apply_async of the registered task, send_task otherwise) give the same
    messages on the same queues: args, kwargs, options and the task's own routing."""
    app = make_app()
    add_entries_with_options(app)
    celery_beat = Scheduler(app)
    with app.producer_or_acquire() as producer:
        for name in sorted(app.conf.beat_schedule):
            celery_beat.apply_async(celery_beat.schedule[name], producer=producer, advance=False)
        for entry in beat_entries(app, include_defaults=False):
            args, kwargs = entry.call_arguments()
            task = app.tasks.get(entry.task)
            if task is not None:
                task.apply_async(args, kwargs, producer=producer, **entry.options)
            else:
                app.send_task(entry.task, args, kwargs, producer=producer, **entry.options)

    with app.connection_for_read() as conn:
        for queue_name in QUEUES:
            queue = conn.SimpleQueue(queue_name, no_ack=True)
            got = [message_shape(queue.get(timeout=1)) for _ in range(2)]
            assert got[0] == got[1], queue_name  # beat's send, then ours
            assert queue.qsize() == 0
            queue.close()
    assert got[0][0] == "remote.job"


def test_lazy_arguments_are_evaluated_at_each_send_as_beat_does():
    calls = []

    def stamp(prefix):
        calls.append(prefix)
        return f"{prefix}{len(calls)}"

    entry = beat_entry(
        "lazy",
        {
            "task": "t",
            "schedule": 10,
            "args": (BeatLazyFunc(stamp, "a"), 2),
            "kwargs": {"when": BeatLazyFunc(stamp, prefix="k"), "n": 1},
        },
        make_app(),
    )
    assert entry.call_arguments() == (["a1", 2], {"when": "k2", "n": 1})
    assert entry.call_arguments() == (["a3", 2], {"when": "k4", "n": 1})


def test_entry_values_are_read_only_copies():
    options = {"queue": "q"}
    entry = beat_entry("e", {"task": "t", "schedule": 10, "options": options}, make_app())
    options["queue"] = "changed"
    assert entry.options["queue"] == "q"
    with pytest.raises(TypeError):
        entry.options["queue"] = "x"


# -- the pure CeleryCrontab value ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message", "field"),
    [
        (({60}, {0}, {0}, {1}, {1}), r"minute: 60 is not a whole number in 0-59", "minute"),
        (({0}, {0}, {7}, {1}, {1}), r"day_of_week: 7 is not a whole number in 0-6", "day_of_week"),
        (({0}, set(), {0}, {1}, {1}), r"hour: no values; allowed: 0-23", "hour"),
        (({0}, "3", {0}, {1}, {1}), r"hour: expected a set of whole numbers 0-23", "hour"),
        (({True}, {0}, {0}, {1}, {1}), r"minute: True is not a whole number", "minute"),
        (({0}, {0}, {0}, {30, 31}, {2}), r"day_of_month 30-31 never occurs in month_of_year 2",
         "day_of_month"),
    ],
)  # fmt: skip
def test_celery_crontab_refuses_what_celery_refuses_naming_the_field(fields, message, field):
    with pytest.raises(CeleryCrontabError, match=message) as err:
        CeleryCrontab(*fields)
    assert err.value.field == field


def test_celery_refuses_the_30th_of_february_too():
    with pytest.raises(ValueError, match="never occurs"):
        crontab(day_of_month=30, month_of_year=2)


def test_celery_crontab_is_an_immutable_value():
    c = CeleryCrontab({0, 30}, range(9, 18), {1, 2, 3, 4, 5}, range(1, 32), range(1, 13))
    assert c.spec == "0,30 9-17 * * 1-5"
    assert c.describe() == "crontab 0,30 9-17 * * 1-5"
    assert c.describe(ZoneInfo("Europe/Berlin")) == "crontab 0,30 9-17 * * 1-5 (Europe/Berlin)"
    assert not c.never
    same = CeleryCrontab([30, 0], list(range(9, 18)), [5, 4, 3, 2, 1], range(1, 32), range(1, 13))
    assert c == same and hash(c) == hash(same)
    assert c != CeleryCrontab({0}, range(9, 18), {1, 2, 3, 4, 5}, range(1, 32), range(1, 13))
    assert pickle.loads(pickle.dumps(c)) == c
    with pytest.raises(AttributeError, match="immutable"):
        c.minute = frozenset({1})
    with pytest.raises(ValueError, match="timezone-aware"):
        c.next(datetime(2026, 1, 1))


def test_the_spec_keeps_how_the_crontab_was_written():
    entry = beat_entry(
        "e", {"task": "t", "schedule": crontab(minute="*/15", day_of_week="mon-fri")}, make_app()
    )
    assert entry.describe() == "crontab */15 * * * mon-fri (UTC)"
    sets = beat_entry("e", {"task": "t", "schedule": crontab(minute={0, 1, 2, 30})}, make_app())
    assert sets.describe() == "crontab 0-2,30 * * * * (UTC)"


@pytest.mark.parametrize(
    ("fields", "field", "expected"),
    [
        ({"hour": "22-2"}, "hour", {22, 23, 0, 1, 2}),  # ranges wrap (cron refuses 22-2)
        ({"day_of_week": "fri-mon"}, "day_of_week", {5, 6, 0, 1}),
        ({"day_of_week": "saturnalia"}, "day_of_week", {6}),  # the first three letters count
        ({"month_of_year": "jan,Dec"}, "month_of_year", {1, 12}),
    ],
)
def test_celerys_syntax_as_the_module_docstring_describes_it(fields, field, expected):
    c = crontab(**fields)
    assert getattr(c, field) == expected
    entry = beat_entry("e", {"task": "t", "schedule": crontab(**fields)}, make_app())
    assert getattr(entry.schedule, field) == expected


@pytest.mark.parametrize("fields", [{"minute": "5/15"}, {"day_of_week": 7}, {"day_of_week": "7"}])
def test_celery_refuses_n_slash_s_and_day_of_week_7(fields):
    with pytest.raises(ValueError):
        crontab(**fields)
