"""An adoption corpus: a ``beat_schedule`` written the way real Celery projects write theirs.

A Django-style settings module (``CELERY_*`` names, read with ``config_from_object(...,
namespace="CELERY")``; a plain module, no Django), with crontabs that use day names, ranges and
lists in the app's timezone, intervals as a ``timedelta``, a number and a ``schedule``,
``expires``, ``options.queue``, args and kwargs, a ``relative`` interval, ``solar``, and schedule
classes of the project's own: a flag-driven one (its state in the project's database, here a
Redis key), a wrapper around a crontab, and a ``crontab`` subclass in the style of
django-celery-beat's ``TzAwareCrontab``.

The corpus is built around one timeline (:func:`timeline`): minutes that hold a sunrise, so every
kind fires in it. :class:`RecordingScheduler` is Celery's own ``celery.beat.Scheduler``; only its
send is replaced by a record of (entry, instant), so what decides when an entry fires is Celery's.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import ephem
import redis
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar

from support.cron import T0

#: The app's timezone in the corpus (crontabs are read in it).
TIMEZONE = "Europe/Berlin"
#: Where the corpus's sunrise happens: 6:00 local solar time is about 00:00 UTC at 90 degrees E.
LATITUDE, LONGITUDE = 0.0, 90.0
#: The flag the flag-driven schedule reads (the project's "database").
FLAG = "proj:flag:sync"
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(frozen=True)
class Timeline:
    """``minutes`` of whole seconds from ``start``; the flag is on in ``[flag_on, flag_off)``."""

    start: datetime
    minutes: int
    flag_on: datetime
    flag_off: datetime

    def instants(self) -> list[datetime]:
        return [self.start + timedelta(seconds=s) for s in range(self.minutes * 60 + 1)]


def timeline(minutes: int = 8) -> Timeline:
    """Minutes around the first sunrise at (LATITUDE, LONGITUDE) after ``T0`` - 3 h, starting
    3 minutes before it, on a whole minute plus 7 s (a beat starts mid-window)."""
    observer = ephem.Observer()
    observer.lat, observer.lon = str(LATITUDE), str(LONGITUDE)
    observer.pressure, observer.horizon = 0, "-0:34"
    observer.date = (T0 - timedelta(hours=3)).replace(tzinfo=None)
    sunrise = observer.next_rising(ephem.Sun()).datetime().replace(tzinfo=UTC)
    start = sunrise.replace(second=7, microsecond=0) - timedelta(minutes=3)
    return Timeline(start, minutes, start + timedelta(seconds=100), start + timedelta(seconds=300))


class FlagSchedule(BaseSchedule):
    """Every ``every`` while the project's database says the job is enabled (the flag), checked
    again in 5 s while it is not: a schedule whose answer depends on state of its own."""

    def __init__(self, url: str, flag: str, every: timedelta, nowfun: Any = None, app: Any = None):
        super().__init__(nowfun=nowfun, app=app)
        self.url, self.flag, self.every = url, flag, every
        self.db = redis.Redis.from_url(url, decode_responses=True)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + self.every - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        if self.db.get(self.flag) != "on":
            return schedstate(False, 5.0)
        left = self.remaining_estimate(last_run_at).total_seconds()
        if left <= 0:
            return schedstate(True, self.every.total_seconds())
        return schedstate(False, left)

    def __repr__(self) -> str:
        return f"<flag {self.flag} every {self.every}>"


class Wrapped(BaseSchedule):
    """A wrapper around a crontab (a project's "business schedule" class): the crontab answers,
    read with the app beat gives the wrapper."""

    def __init__(self, inner: crontab, nowfun: Any = None, app: Any = None):
        super().__init__(nowfun=nowfun, app=app)
        self.inner = inner

    def _synced(self) -> crontab:
        self.inner.app = self.app
        return self.inner

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return self._synced().remaining_estimate(last_run_at)

    def is_due(self, last_run_at: datetime) -> schedstate:
        return self._synced().is_due(last_run_at)

    def __repr__(self) -> str:
        return f"<wrapped {self.inner!r}>"


class TzAwareCrontab(crontab):
    """A crontab read in a zone of its own, as django-celery-beat's ``TzAwareCrontab``: it turns
    ``last_run_at`` into its zone before asking the crontab."""

    def __init__(self, *args: Any, zone: str = "America/New_York", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tz = ZoneInfo(zone)

    def is_due(self, last_run_at: datetime) -> schedstate:
        return super().is_due(last_run_at.astimezone(self.tz))


def settings_module(broker_url: str, state_url: str, line: Timeline) -> types.ModuleType:
    """A fresh ``proj.settings`` (fresh schedule objects: a schedule keeps the app beat gives it)
    in the Django style: ``CELERY_*`` names."""
    local = line.start.astimezone(ZoneInfo(TIMEZONE))
    day = _DAYS[local.isoweekday() % 7]
    days = f"{day}-{_DAYS[(local.isoweekday() + 2) % 7]}"  # a range of names, maybe wrapping
    other_days = ",".join(d for d in _DAYS if d != day)
    minutes = ",".join(str((local + timedelta(minutes=k)).minute) for k in (1, 5))
    hours = f"{local.hour}-{(local.hour + 1) % 24}"
    module = types.ModuleType("proj_settings")
    module.CELERY_BROKER_URL = broker_url
    module.CELERY_TIMEZONE = TIMEZONE
    module.CELERY_ENABLE_UTC = True
    module.CELERY_TASK_DEFAULT_QUEUE = "celery"
    module.CELERY_BEAT_SCHEDULE = {
        "digest-every-2-min": {
            "task": "proj.reports.digest",
            "schedule": crontab(minute="*/2", hour=hours, day_of_week=days),
            "args": ("daily",),
            "kwargs": {"recipients": ["ops@example.com"], "html": True},
            "options": {"queue": "reports", "expires": 90},
        },
        "at-two-minutes": {
            "task": "proj.reports.snapshot",
            "schedule": crontab(minute=minutes),
        },
        "not-today": {
            "task": "proj.reports.weekly",
            "schedule": crontab(minute="*", day_of_week=other_days),
        },
        "heartbeat-20s": {
            "task": "proj.health.heartbeat",
            "schedule": timedelta(seconds=20),
            "options": {"expires": 15},
        },
        "sync-90s": {"task": "proj.sync.pull", "schedule": 90.0, "kwargs": {"full": False}},
        "schedule-2m": {"task": "proj.sync.push", "schedule": schedule(timedelta(minutes=2))},
        "relative-2m": {
            "task": "proj.sync.rollup",
            "schedule": timedelta(minutes=2),
            "relative": True,
        },
        "at-sunrise": {
            "task": "proj.garden.lights_off",
            "schedule": solar("sunrise", LATITUDE, LONGITUDE),
        },
        "flag-driven-30s": {
            "task": "proj.sync.feeds",
            "schedule": FlagSchedule(state_url, FLAG, timedelta(seconds=30)),
        },
        "wrapped-every-3-min": {
            "task": "proj.reports.wrapped",
            "schedule": Wrapped(crontab(minute="*/3")),
        },
        "tz-aware-every-4-min": {
            "task": "proj.reports.tz_aware",
            "schedule": TzAwareCrontab(minute="*/4"),
            "args": [1, 2],
        },
    }
    return module


def corpus_app(module: types.ModuleType, clock: list[datetime]) -> Celery:
    """The project's app, configured as a Django project configures it, its ``now()`` (what
    every schedule reads) the test clock ``clock[0]``. checkbeat's settings come from the
    suite's ``CHECKBEAT_*`` environment."""
    app = Celery("proj")
    app.config_from_object(module, namespace="CELERY")
    app.now = lambda: clock[0].astimezone(app.timezone)
    return app


class RecordingScheduler(Scheduler):
    """``celery.beat.Scheduler`` as it is: its ``tick`` decides what is due and reserves it
    (``last_run_at`` = ``app.now()``); the send records (entry, instant) instead of publishing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[tuple[str, datetime]] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **_: Any) -> None:
        entry = self.reserve(entry) if advance else entry
        self.sent.append((entry.name, self.app.now().astimezone(UTC)))

    def tick_all(self) -> None:
        """Tick until nothing more is due now (``tick`` sends one entry per call)."""
        for _ in range(100):
            if self.tick() != 0:
                return
        raise AssertionError("Celery's Scheduler kept finding entries due")
