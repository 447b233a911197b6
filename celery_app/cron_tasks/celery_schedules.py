"""Celery's own periodic entries (``beat_schedule``, ``add_periodic_task``) as frozen values.

Why: a Celery project that switches to ``CronScheduler`` keeps its ``beat_schedule``; each entry
must fire with the times Celery's beat would give it, or be refused at start naming the entry.
Nothing is dropped silently. :func:`beat_entries` reads an app's ``beat_schedule`` the way
``celery.beat.Scheduler.setup_schedule`` does (``add_periodic_task`` calls land there: pending
ones when the configuration loads, later ones directly, so read it after ``app.finalize()``,
as ``celery beat`` does) and :func:`beat_entry` converts one entry.

What is supported, and how exactly
----------------------------------
* ``celery.schedules.crontab`` (the class itself): :class:`scheduling_core.celery_crontab.
  CeleryCrontab` in the crontab's timezone, the one Celery 5.7 reads it in: ``crontab.tz``,
  which beat makes the app's ``timezone`` (``timezone`` if set, else UTC with ``enable_utc``, else
  the machine's zone) by setting ``schedule.app`` to its own app, unless ``tz`` was read before.
  (``PersistentScheduler``'s entries come back from its shelve without an app and read the
  *current* app's timezone; under ``celery -A proj beat`` that is the same app.)
  A ``nowfun`` is only a clock to Celery 5.7; it must return the current time (in the crontab's
  zone, or naive UTC, since Celery 5.6 reads the crontab in the zone ``nowfun`` returns),
  otherwise the entry is refused: beat would fire by that other clock. The entry's ``relative``
  does not apply to a crontab (Celery ignores it too).
* Intervals: a ``datetime.timedelta``, a number of seconds (``int`` or ``float``) or a
  ``celery.schedules.schedule`` (``relative=False``), one second or more: an :class:`Interval`
  whose windows are ``anchor + k*every``, the anchor being the first instant any beat saw the
  entry (kept in Redis, written once, the same on every beat). Celery's own beat fires a new
  entry ``every`` after it first saw it, then ``every`` after each send; here the first firing
  is the same and the next ones stay on that grid (they do not drift by each send's latency),
  which is what makes "one firing per window across beats" decidable.
* Everything else Celery's beat accepts, any ``celery.schedules.BaseSchedule``: ``solar``,
  ``relative=True`` intervals, subclasses of ``crontab`` and ``schedule``, classes of your own
  with ``is_due`` / ``remaining_estimate`` and state of their own: a :class:`CustomSchedule`,
  asked ``is_due(last_run_at)`` as beat asks it, with the entry's last run shared by every beat
  through Redis (see the class).
* First deployment (an entry no beat has seen, or whose schedule changed): as Celery's beat, no
  window that began before a beat first saw it fires; the first firing is the next window start
  after that instant (``every`` after it for an interval, the schedule's own answer for a
  custom one). An entry already seen catches up a window missed while no beat ran, within its
  grace.
* Refused, naming the entry and what is supported: objects that are not schedules (any class
  that is not a ``BaseSchedule``), sub-second and non-positive intervals (on the fixed grid),
  ``bool`` (Celery would read ``True`` as one second), a crontab timezone that is not a
  ``zoneinfo`` zone, entries without a task or a schedule, ``last_run_at`` (the last run is
  kept in Redis, shared by every beat), unknown keys (Celery's beat fails on them), args that
  are not a list or tuple (Celery would iterate a string into characters), and options that
  collide with the arguments beat passes itself (``args``, ``kwargs``, ``producer``). ``name``,
  ``app`` and ``total_run_count`` in an entry are accepted and ignored, as Celery's beat
  ignores them. Every refused entry of a ``beat_schedule`` is named at once, one line each.

Sending, as beat does (``Scheduler.apply_async``)
-------------------------------------------------
``BeatEntry.call_arguments()`` evaluates ``BeatLazyFunc`` values in ``args``/``kwargs`` at each
send, as beat does; ``options`` are the entry's, complete (queue, routing_key, exchange,
priority, expires, headers, and any other ``apply_async`` option). Beat sends with
``app.tasks[task].apply_async(args, kwargs, **options)`` when the task is registered in the beat
process, so the task's own routing (``task_routes``, ``Task.queue``, ``Task.priority``) applies,
and with ``app.send_task(task, args, kwargs, **options)`` when it is not; the publisher that
sends these entries must do the same to be exact.

:func:`beat_entries` also adds Celery's one default entry, as beat does: ``celery.backend_cleanup``
daily at 04:00 (``options={"expires": 12 * 3600}``) when ``result_expires`` is set and the
result backend does not expire results itself (``include_defaults=False`` leaves it out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

from celery import Celery
from celery.beat import BeatLazyFunc
from celery.schedules import BaseSchedule, crontab, schedule

from celery_app.errors import CheckbeatError
from scheduling_core._time import require_aware
from scheduling_core.celery_crontab import CeleryCrontab

__all__ = [
    "MIN_INTERVAL",
    "SUPPORTED",
    "BeatEntry",
    "BeatEntryError",
    "BeatEntryErrors",
    "CustomSchedule",
    "Interval",
    "IntervalWindow",
    "beat_entries",
    "beat_entry",
    "interval_window",
]

MIN_INTERVAL = timedelta(seconds=1)
#: How far a crontab's or schedule's ``nowfun`` may be from the real clock.
CLOCK_TOLERANCE = timedelta(seconds=2)
SUPPORTED = (
    "an instance of celery.schedules.BaseSchedule (crontab, schedule, solar, or a class of your "
    "own), or an interval of 1 second or more: a datetime.timedelta or a number of seconds"
)
#: Keys of a beat_schedule entry that are honoured.
ENTRY_KEYS = ("task", "schedule", "args", "kwargs", "options", "relative")
#: Keys Celery's beat accepts and ignores: it overrides name and app, and only counts runs.
IGNORED_KEYS = ("name", "app", "total_run_count")
#: Options beat cannot pass: it gives these to apply_async itself.
RESERVED_OPTIONS = ("args", "kwargs", "producer")
#: Celery's default entry (``Scheduler.install_default_entries``).
BACKEND_CLEANUP = "celery.backend_cleanup"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Zulu"})


class BeatEntryError(CheckbeatError, ValueError):
    """A ``beat_schedule`` entry CronScheduler cannot fire exactly as Celery's beat would.

    The message names the entry and what is supported; ``entry`` is the entry's name.
    """

    def __init__(self, entry: str, problem: str) -> None:
        super().__init__(f"beat_schedule entry {entry!r}: {problem}")
        self.entry = entry


# -- intervals -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntervalWindow:
    """Window ``index`` of an interval: ``[start, end)``, UTC."""

    index: int
    start: datetime
    end: datetime


def interval_window(t: datetime, every: timedelta, anchor: datetime = _EPOCH) -> IntervalWindow:
    """The window of length ``every`` that ``t`` falls in: window k is
    ``[anchor + k*every, anchor + (k+1)*every)``, exact to the microsecond, so every beat that
    reads the same anchor agrees on it."""
    require_aware(t, "t")
    if not isinstance(every, timedelta) or every < _MICROSECOND:
        raise ValueError(f"every must be a positive timedelta, got {every!r}")
    step = every // _MICROSECOND
    index = ((t - anchor) // _MICROSECOND) // step
    start = anchor + index * step * _MICROSECOND
    return IntervalWindow(index, start, start + step * _MICROSECOND)


@dataclass(frozen=True)
class Interval:
    """An interval schedule: it fires once per window, at the window's start.

    Windows are ``anchor + k*every``. The engine sets ``anchor`` to the instant a beat first saw
    the task (``Keys.cron_ref``, written once, read alike by every beat), so the firings are
    Celery's beat's: the first ``every`` after the task was first seen, then every ``every``.
    Without one (the Unix epoch) the windows are only what a reader that has not asked Redis
    can show. ``next``/``next_after`` answer like a crontab's (in ``t``'s timezone), so the
    engine can hold either; ``window`` names the window a firing belongs to.
    """

    every: timedelta
    anchor: datetime = _EPOCH

    def __post_init__(self) -> None:
        if not isinstance(self.every, timedelta) or self.every < MIN_INTERVAL:
            raise ValueError(f"an interval must be a timedelta of 1 second or more: {self.every!r}")

    def anchored(self, anchor: datetime) -> Interval:
        """The same interval with its windows counted from ``anchor``."""
        return Interval(self.every, require_aware(anchor, "anchor").astimezone(UTC))

    def window(self, t: datetime) -> IntervalWindow:
        return interval_window(t, self.every, self.anchor)

    def next(self, t: datetime) -> datetime:
        """The first window start ``>= t``, in ``t``'s timezone."""
        window = self.window(t)
        start = window.start if window.start == t.astimezone(UTC) else window.end
        return start.astimezone(t.tzinfo)

    def next_after(self, t: datetime) -> datetime:
        """The start of the window after ``t``'s, in ``t``'s timezone."""
        return self.window(t).end.astimezone(t.tzinfo)

    def matches(self, t: datetime) -> bool:
        """Whether ``t`` is a window start (a firing instant)."""
        return self.window(t).start == t.astimezone(UTC)

    def describe(self, tz: object = None) -> str:
        """``"every 20 seconds"`` (the zone does not matter to an interval)."""
        seconds = self.every.total_seconds()
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds >= size and seconds % size == 0:
                count = int(seconds // size)
                return f"every {count} {unit}{'s' if count != 1 else ''}"
        return f"every {seconds:g} second{'s' if seconds != 1 else ''}"


# -- schedules without a fixed grid ----------------------------------------------------------------


@dataclass(frozen=True)
class CustomSchedule:
    """A Celery schedule with no fixed grid of windows, fired as Celery's beat fires it.

    ``solar``, ``relative=True`` intervals, subclasses of ``crontab`` and ``schedule`` and any
    other ``celery.schedules.BaseSchedule``: their ``is_due(last_run_at)`` decides, and may read
    state of their own (a database row, a flag). What makes them exactly-once across beats is
    that every beat asks with the same ``last_run_at``: the task's last run kept in Redis
    (``Keys.cron_ref``; the first instant a beat saw the task until it first fires, as beat's
    new entry starts with ``last_run_at`` = now). The window is named after that shared last
    run, and the claim that fires it moves it to the claim's time, atomically
    (``cron_claim.lua``), so two beats that both see it due claim one key, and it fires once.
    """

    value: Any = field(compare=False)
    text: str = ""
    custom: bool = True

    def next(self, t: datetime) -> None:
        """No fixed next window: the engine asks :meth:`is_due` every time it is due."""
        return None

    def is_due(self, last_run_at: datetime) -> tuple[bool, float | None]:
        """The schedule's own answer: (due now, seconds until it should be asked again; None
        when it gave no number, and beat then asks again after its max interval)."""
        due, next_s = self.value.is_due(last_run_at)
        number = isinstance(next_s, (int, float)) and not isinstance(next_s, bool)
        return bool(due), float(next_s) if number else None

    def next_after(self, last_run_at: datetime) -> datetime | None:
        """When it is next due after a run at ``last_run_at``, by its ``remaining_estimate``
        (what ``schedule list`` shows); None when it cannot say. ``last_run_at`` is read in the
        schedule's zone, as beat's entries hold it."""
        try:
            remaining = self.value.remaining_estimate(last_run_at.astimezone(self.value.tz))
            now = self.value.now()
        except Exception:  # NotImplementedError on a bare BaseSchedule, or its own failure
            return None
        if not isinstance(remaining, timedelta) or not isinstance(now, datetime):
            return None
        now = now if now.utcoffset() is not None else now.replace(tzinfo=UTC)
        return max(now, now + remaining).astimezone(UTC)

    def describe(self, tz: object = None) -> str:
        return self.text


def _custom_text(value: Any) -> str:
    """How ``schedule list`` shows a custom schedule (and what its fingerprint is made of): its
    class and its ``repr`` when the class has one of its own (an object address would change at
    each start and reset the task's state)."""
    cls = type(value)
    if cls.__repr__ is object.__repr__:  # type: ignore[comparison-overlap]  # one function?
        return _class_name(value)
    return f"{_class_name(value)} {value!r}"


# -- the entry -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BeatEntry:
    """One ``beat_schedule`` entry, converted: what to send, and when.

    ``zone`` is the crontab's timezone (read ``schedule`` in it); None for an interval.
    ``kwargs`` and ``options`` are read-only copies; values inside are the entry's own objects.
    """

    name: str
    task: str
    schedule: CeleryCrontab | Interval | CustomSchedule
    zone: tzinfo | None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def next_fire(self, at: datetime) -> datetime | None:
        """The first firing (UTC) at or after ``at``."""
        require_aware(at, "at")
        found = self.schedule.next(at.astimezone(self.zone or UTC))
        return None if found is None else found.astimezone(UTC)

    def call_arguments(self) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` for one send, ``BeatLazyFunc`` values called now, as beat's
        ``_evaluate_entry_args``/``_evaluate_entry_kwargs`` do."""
        args = [v() if isinstance(v, BeatLazyFunc) else v for v in self.args]
        kwargs = {k: v() if isinstance(v, BeatLazyFunc) else v for k, v in self.kwargs.items()}
        return args, kwargs

    def describe(self) -> str:
        return self.schedule.describe(self.zone)


class BeatEntryErrors(BeatEntryError):
    """Several entries cannot be fired: the message names each, one line per entry, so a user
    fixes them all in one go."""

    def __init__(self, errors: list[BeatEntryError]) -> None:
        ValueError.__init__(self, "\n".join(str(error) for error in errors))
        self.entry = errors[0].entry
        self.errors = tuple(errors)


def beat_entries(app: Celery, *, include_defaults: bool = True) -> tuple[BeatEntry, ...]:
    """Every entry of ``app.conf.beat_schedule`` (with Celery's default entry), converted;
    entries that cannot be fired raise :class:`BeatEntryError` (one) or
    :class:`BeatEntryErrors` (several, each named on its own line)."""
    entries = dict(app.conf.beat_schedule or {})
    if include_defaults and BACKEND_CLEANUP not in entries and _needs_backend_cleanup(app):
        entries[BACKEND_CLEANUP] = {
            "task": BACKEND_CLEANUP,
            "schedule": crontab("0", "4", "*"),
            "options": {"expires": 12 * 3600},
        }
    converted: list[BeatEntry] = []
    errors: list[BeatEntryError] = []
    for name, entry in entries.items():
        try:
            converted.append(beat_entry(name, entry, app))
        except BeatEntryError as exc:
            errors.append(exc)
        except Exception as exc:  # a schedule whose own code fails (a property, __repr__)
            errors.append(BeatEntryError(str(name), f"reading it raised {exc!r}"))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BeatEntryErrors(errors)
    return tuple(converted)


def _needs_backend_cleanup(app: Celery) -> bool:
    return bool(app.conf.result_expires) and not app.backend.supports_autoexpire


def beat_entry(name: str, entry: Mapping[str, Any], app: Celery) -> BeatEntry:
    """One entry (``{"task": ..., "schedule": ..., "args", "kwargs", "options", "relative"}``)
    of ``app``'s beat_schedule, converted as Celery's beat would read it."""
    if not isinstance(name, str) or not name:
        raise BeatEntryError(str(name), "an entry's name must be a non-empty string")
    if not isinstance(entry, Mapping):
        raise BeatEntryError(name, f"an entry must be a dict, got {type(entry).__name__}")
    _check_keys(name, entry)
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise BeatEntryError(name, f"'task' must be a task name (a non-empty string), got {task!r}")
    if entry.get("schedule") is None:
        raise BeatEntryError(name, f"'schedule' is missing; supported: {SUPPORTED}")
    when, zone = _schedule_of(name, entry["schedule"], bool(entry.get("relative", False)), app)
    return BeatEntry(
        name=name,
        task=task,
        schedule=when,
        zone=zone,
        args=_args_of(name, entry.get("args")),
        kwargs=MappingProxyType(_mapping_of(name, "kwargs", entry.get("kwargs"))),
        options=MappingProxyType(_options_of(name, entry.get("options"))),
    )


def _check_keys(name: str, entry: Mapping[str, Any]) -> None:
    if "last_run_at" in entry:
        raise BeatEntryError(
            name,
            "'last_run_at' is not supported: CronScheduler's windows come from the clock, "
            "not from a last run; remove it",
        )
    unknown = sorted(str(k) for k in entry if k not in ENTRY_KEYS and k not in IGNORED_KEYS)
    if unknown:
        raise BeatEntryError(
            name,
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"an entry has {', '.join(ENTRY_KEYS)}",
        )


def _args_of(name: str, args: Any) -> tuple[Any, ...]:
    if not args:
        return ()
    if not isinstance(args, (list, tuple)):
        hint = " (a one-element tuple needs a comma: ('x',))" if isinstance(args, str) else ""
        raise BeatEntryError(
            name, f"'args' must be a list or a tuple, got {type(args).__name__}{hint}"
        )
    return tuple(args)


def _mapping_of(name: str, key: str, value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if not isinstance(value, Mapping):
        raise BeatEntryError(name, f"{key!r} must be a dict, got {type(value).__name__}")
    bad = sorted(repr(k) for k in value if not isinstance(k, str))
    if bad:
        raise BeatEntryError(name, f"{key!r} keys must be strings, got {', '.join(bad)}")
    return dict(value)


def _options_of(name: str, options: Any) -> dict[str, Any]:
    found = _mapping_of(name, "options", options)
    reserved = sorted(k for k in found if k in RESERVED_OPTIONS)
    if reserved:
        raise BeatEntryError(
            name,
            f"option{'s' if len(reserved) > 1 else ''} {', '.join(map(repr, reserved))} "
            "cannot be passed: beat gives apply_async args, kwargs and producer itself",
        )
    return found


# -- schedules -------------------------------------------------------------------------------------


def _schedule_of(
    name: str, value: Any, relative: bool, app: Celery
) -> tuple[CeleryCrontab | Interval | CustomSchedule, tzinfo | None]:
    if type(value) is crontab:
        return _crontab_of(name, value, app)
    if type(value) is schedule and not value.relative:
        _check_clock(name, value, None)
        every = value.run_every  # type: ignore[attr-defined]  # not in celery-types' schedule
        if not isinstance(every, timedelta):
            raise BeatEntryError(name, f"schedule(run_every={every!r}) is not an interval")
    elif isinstance(value, bool):
        raise BeatEntryError(name, f"{value!r} is not a schedule; supported: {SUPPORTED}")
    elif isinstance(value, (timedelta, int, float)):
        every = _timedelta_of(name, value)
        if relative:
            # as Celery's maybe_schedule: an interval whose deadlines round to its unit
            return _custom_of(name, schedule(every, relative=True, app=app), app), None
    elif isinstance(value, BaseSchedule):
        return _custom_of(name, value, app), None
    else:
        raise BeatEntryError(
            name, f"{_class_name(value)} is not a schedule; supported: {SUPPORTED}"
        )
    every = timedelta(days=every.days, seconds=every.seconds, microseconds=every.microseconds)
    if every < MIN_INTERVAL:
        raise BeatEntryError(
            name,
            f"an interval of {every.total_seconds():g} seconds is shorter than 1 second; "
            f"supported: {SUPPORTED}",
        )
    return Interval(every), None


def _custom_of(name: str, value: BaseSchedule, app: Celery) -> CustomSchedule:
    """A schedule asked ``is_due`` as beat asks it; beat gives it its own app first
    (``maybe_schedule``), so its ``now()`` and timezone are the app's."""
    value.app = app
    if not callable(getattr(value, "is_due", None)):
        raise BeatEntryError(name, f"{_class_name(value)} has no is_due(last_run_at) method")
    return CustomSchedule(value, _custom_text(value))


def _timedelta_of(name: str, value: timedelta | float) -> timedelta:
    """A timedelta, or an int or float of seconds (the only numbers Celery's maybe_schedule
    reads)."""
    if isinstance(value, timedelta):
        return value
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise BeatEntryError(
            name, f"{value!r} is not a number of seconds a timedelta can hold"
        ) from None


def _class_name(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _crontab_of(name: str, value: crontab, app: Celery) -> tuple[CeleryCrontab, tzinfo]:
    # beat sets schedule.app to its own app (maybe_schedule), so crontab.tz is that app's
    # timezone, unless tz was read (and cached) earlier
    zone = vars(value).get("tz", app.timezone)
    if not isinstance(zone, (ZoneInfo, timezone)):
        raise BeatEntryError(
            name,
            f"the crontab's timezone {zone!r} is not a zoneinfo zone, so its DST transitions "
            "cannot be read exactly; set the app's timezone to an IANA name (e.g. 'UTC')",
        )
    _check_clock(name, value, zone)
    parsed: Any = value  # crontab.__init__ sets the fields below; celery-types declares none
    fields = (
        parsed.minute,
        parsed.hour,
        parsed.day_of_week,
        parsed.day_of_month,
        parsed.month_of_year,
    )
    return CeleryCrontab(*fields, spec=_spec_of(value)), zone


def _spec_of(value: crontab) -> str | None:
    """The crontab as written (cron order, as Celery's repr), when every field was a string or
    an int; None lets CeleryCrontab render the sets."""
    written = tuple(
        getattr(value, f"_orig_{field}", None)
        for field in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    )
    if all(isinstance(f, (str, int)) and not isinstance(f, bool) for f in written):
        return " ".join(str(f) for f in written)
    return None


def _check_clock(name: str, value: crontab | schedule, zone: tzinfo | None) -> None:
    """A ``nowfun`` is honoured only as what Celery 5.7 uses it for: the current time."""
    nowfun = value.nowfun  # type: ignore[union-attr]  # in both; not in celery-types
    if nowfun is None:
        return
    try:
        now = nowfun()
    except Exception as exc:
        raise BeatEntryError(name, f"the schedule's nowfun raised {exc!r}") from None
    if not isinstance(now, datetime):
        raise BeatEntryError(name, f"the schedule's nowfun returned {now!r}, not a datetime")
    naive = now.tzinfo is None or now.utcoffset() is None
    aware = now.replace(tzinfo=UTC) if naive else now  # Celery reads a naive now as UTC
    skew = abs(aware - datetime.now(UTC))
    if skew > CLOCK_TOLERANCE:
        raise BeatEntryError(
            name,
            f"the schedule's nowfun returned {now.isoformat()}, {skew.total_seconds():.0f} s "
            "from the current time (a naive result is read as UTC, as Celery does); beat would "
            "fire by that clock, CronScheduler fires by the real one; remove nowfun",
        )
    if zone is not None and not naive and not _same_zone(now.tzinfo, zone):  # type: ignore[arg-type]  # aware
        raise BeatEntryError(
            name,
            f"the crontab's nowfun returns times in {_zone_name(now.tzinfo)}, but it is read in "
            f"the app's timezone {_zone_name(zone)}: Celery 5.7 reads it in the app's, 5.6 in "
            "nowfun's, so its times depend on the Celery version; remove nowfun, or set the "
            "app's timezone to the one you mean",
        )


def _zone_name(tz: tzinfo | None) -> str:
    key = getattr(tz, "key", None)
    if key:
        return "UTC" if key in _UTC_NAMES else str(key)
    if tz == UTC:
        return "UTC"
    return str(tz)


def _same_zone(a: tzinfo, b: tzinfo) -> bool:
    return a is b or a == b or _zone_name(a) == _zone_name(b)
