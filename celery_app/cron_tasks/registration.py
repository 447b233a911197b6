"""Cron task registration: ``@cron("0 3 * * *")`` turns a function into a scheduled Celery task.

Why the spec is parsed here: a schedule that cannot be parsed must fail the import of the module
that declares it, so every ``celery -A celery_app ...`` command fails naming the task, the spec
and the offending token, instead of a task that silently never runs.

A declaration lives in the app's registry (:mod:`celery_app.registry`): shared (every app's)
without ``app=``, that app's only with it; the function also becomes a Celery task of the same
scope, which is what a worker runs. A task declared without a timezone follows the
``CHECKBEAT_TIMEZONE`` of the app reading it, resolved by :func:`cron_tasks`, never at import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cached_property, lru_cache
from typing import Any, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery import Celery, shared_task

from celery_app.cron_tasks.celery_schedules import BeatEntry, CustomSchedule, Interval
from celery_app.errors import CheckbeatError
from celery_app.factory import settings_of
from celery_app.names import ID_RULE, is_id
from celery_app.redis.schema import CronSource, Overlap
from celery_app.registry import CRON, declaring_registry, origin_of, registry_of
from scheduling_core.celery_crontab import CeleryCrontab
from scheduling_core.cron import CronError, Schedule, parse

DEFAULT_TIMEOUT = timedelta(minutes=5)
#: Tenant placeholder in keys of tasks that are not per-tenant.
GLOBAL_TENANT = "-"
#: Extra seconds between the soft time limit (the timeout) and the hard kill.
HARD_LIMIT_MARGIN = 5.0
WINDOW = timedelta(minutes=1)
#: Longest expected duration of a task without a timeout (a beat_schedule entry's).
MAX_EXPECTED_DURATION = timedelta(days=31)


class CronSpecError(CheckbeatError, ValueError):
    """A cron task declaration is invalid; the message names the task and what is wrong."""


@dataclass(frozen=True)
class Instant:
    """The schedule of a forced run-now: one window at the instant it was asked for, a
    microsecond long (so its id, to the microsecond, is no scheduled window's); it never fires
    again."""

    every: timedelta = timedelta(microseconds=1)

    def next(self, t: datetime) -> None:
        return None

    def next_after(self, t: datetime) -> None:
        return None


#: Everything a :class:`CronTask` fires by, one class per source: an ``@cron`` or runtime spec
#: (:class:`Schedule`), a Celery ``crontab`` (:class:`CeleryCrontab`), an interval, a Celery
#: schedule with no fixed grid asked ``is_due`` (:class:`CustomSchedule`), a forced run-now.
CronSchedule: TypeAlias = Schedule | CeleryCrontab | Interval | CustomSchedule | Instant


@dataclass(frozen=True)
class CronTask:
    """One scheduled task, from any source (``@cron``, ``beat_schedule``, runtime).

    ``schedule`` is one of :data:`CronSchedule`; the window a firing belongs to is a minute for
    crontabs and the interval's own window for intervals (and a forced run's :class:`Instant`),
    anchored where a beat first saw the task (:attr:`window_length`,
    :meth:`window_id_of`). ``grace`` None means the app's ``CHECKBEAT_CRON_GRACE``;
    ``expected_duration`` None means the timeout (what the cron monitor watches runs by). ``args``,
    ``kwargs`` and ``options`` are what the message carries (a beat_schedule entry's, as beat
    sends them; ``entry`` evaluates its ``BeatLazyFunc`` arguments at each send).
    """

    id: str
    name: str  # the Celery task name
    spec: str
    schedule: CronSchedule = field(compare=False, repr=False)
    singleton: bool = True
    per_tenant: bool = False
    timeout: timedelta = DEFAULT_TIMEOUT
    timezone: str = "UTC"
    queue: str | None = None
    zone: tzinfo = field(default=ZoneInfo("UTC"), compare=False, repr=False)
    source: str = CronSource.CRON
    label: str = ""  # the name as declared, when it is not a valid id (add_periodic_task)
    grace: timedelta | None = None
    overlap: str = Overlap.SKIP
    expected_duration: timedelta | None = None  # None: the timeout
    args: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    kwargs: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    options: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    entry: BeatEntry | None = field(default=None, compare=False, repr=False)

    @property
    def scope(self) -> str:
        return "per-tenant" if self.per_tenant else "global"

    @cached_property
    def soft_time_limit(self) -> float:
        return self.timeout.total_seconds()

    @cached_property
    def hard_time_limit(self) -> float:
        return self.timeout.total_seconds() + HARD_LIMIT_MARGIN

    @property
    def display_name(self) -> str:
        return self.label or self.id

    @cached_property
    def window_length(self) -> timedelta:
        """How long one window lasts: the interval (or instant), or a minute for a crontab."""
        if isinstance(self.schedule, Interval | Instant):
            return self.schedule.every
        return WINDOW

    @cached_property
    def is_interval(self) -> bool:
        """Whether windows are the schedule's own length (named to the second or finer), not
        minutes: an interval, or a forced run's instant."""
        return isinstance(self.schedule, Interval | Instant)

    @cached_property
    def is_custom(self) -> bool:
        """Whether the schedule has no fixed grid of windows (a ``BaseSchedule`` asked
        ``is_due`` with the last run all beats share, :class:`CustomSchedule`)."""
        return isinstance(self.schedule, CustomSchedule)

    @property
    def anchor(self) -> datetime | None:
        """An interval's anchor (tasks with one spec but different anchors fire apart); None
        for any other schedule."""
        return self.schedule.anchor if isinstance(self.schedule, Interval) else None

    @cached_property
    def fingerprint(self) -> str:
        """A short digest of what decides the task's windows (kind, spec, timezone): the
        state that only holds for one schedule (``Keys.cron_ref``) is keyed by it, so a changed
        schedule starts as a new one."""
        text = f"{type(self.schedule).__name__}|{self.spec}|{self.timezone}"
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    @cached_property
    def plain_message(self) -> bool:
        """Whether a firing is a bare message (no args, no apply_async options, not a
        beat_schedule entry): the fast, common case of ``cron_message``."""
        return self.source != CronSource.BEAT_SCHEDULE and not self.options and not self.args

    def window_id_of(self, start: datetime) -> str:
        """The window's name in keys and messages: the UTC minute for a crontab (the keys of
        ``@cron`` tasks stay as they were), the UTC second for an interval."""
        if self.is_interval:
            return interval_window_id(start)
        return window_id(start)

    def window_of(self, at: datetime) -> datetime:
        """Start (UTC) of this task's window that ``at`` falls in."""
        if isinstance(self.schedule, Interval):
            return self.schedule.window(at).start
        if isinstance(self.schedule, Instant):
            return at.astimezone(UTC)  # its one window is the instant itself
        return window_start(at)

    def with_anchor(self, anchor: datetime) -> CronTask:
        """The task with its interval's windows counted from ``anchor`` (its reference instant,
        ``Keys.cron_ref``); any other schedule has no grid to anchor: the task as it is."""
        if isinstance(self.schedule, Interval):
            return replace(self, schedule=self.schedule.anchored(anchor))
        return self

    def is_due(self, last_run_at: datetime) -> tuple[bool, float | None]:
        """A schedule without a fixed grid's own answer (:meth:`CustomSchedule.is_due`); a
        schedule with one is never asked (beat computes its windows)."""
        if not isinstance(self.schedule, CustomSchedule):
            raise TypeError(f"cron task {self.id!r}: its schedule has windows, not is_due")
        return self.schedule.is_due(last_run_at)

    def grace_or(self, default: timedelta) -> timedelta:
        return default if self.grace is None else self.grace

    @property
    def expected(self) -> timedelta:
        """How long a run is expected to take: ``expected_duration``, else the timeout."""
        return self.timeout if self.expected_duration is None else self.expected_duration

    def call_arguments(self) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments of one send (a beat entry's lazy values called)."""
        if self.entry is not None:
            return self.entry.call_arguments()
        return list(self.args), dict(self.kwargs)

    def next_fire(self, at: datetime) -> datetime | None:
        """Start (UTC) of the first window at or after ``at`` this task fires in.

        The schedule is evaluated in the task's timezone, so DST follows its parser's rules;
        windows are whole minutes (or anchored intervals) in every zone, so the UTC start
        names the window.
        """
        found = self.schedule.next(at.astimezone(self.zone))
        return None if found is None else found.astimezone(UTC)


def window_start(at: datetime) -> datetime:
    """The minute window ``at`` falls in (UTC)."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


@lru_cache(maxsize=256)
def window_id(start: datetime) -> str:
    """The window's name in keys and messages: its UTC ISO minute, e.g. ``2026-11-29T18:30Z``."""
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


@lru_cache(maxsize=256)
def interval_window_id(start: datetime) -> str:
    """An interval window's name: its UTC ISO second, e.g. ``2026-11-29T18:30:20Z`` (with
    microseconds only when the interval is not whole seconds)."""
    utc = start.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_cron_task(
    *,
    task_id: str,
    name: str,
    spec: str,
    timezone: str,
    singleton: bool = True,
    per_tenant: bool = False,
    timeout: timedelta = DEFAULT_TIMEOUT,
    queue: str | None = None,
    grace: timedelta | None = None,
    overlap: str = Overlap.SKIP,
    expected_duration: timedelta | float | None = None,
) -> CronTask:
    """Validate one declaration; raise CronSpecError naming the task on any bad field."""
    if not is_id(task_id):
        raise CronSpecError(f"cron task id {task_id!r}: may contain only {ID_RULE}")
    try:
        schedule = parse(spec)
    except CronError as exc:
        raise CronSpecError(f"cron task {task_id!r}: invalid spec {spec!r}: {exc}") from None
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise CronSpecError(f"cron task {task_id!r}: timeout must be a positive timedelta")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronSpecError(
            f"cron task {task_id!r}: unknown timezone {timezone!r}; use an IANA name such as UTC"
        ) from None
    if queue is not None and not queue:
        raise CronSpecError(f"cron task {task_id!r}: queue must be a non-empty name or None")
    check_policies(f"cron task {task_id!r}", grace, overlap)
    expected = check_expected_duration(f"cron task {task_id!r}", expected_duration, timeout)
    return CronTask(
        id=task_id,
        name=name,
        spec=spec,
        schedule=schedule,
        singleton=singleton,
        per_tenant=per_tenant,
        timeout=timeout,
        timezone=timezone,
        queue=queue,
        zone=zone,
        grace=grace,
        overlap=Overlap(overlap),
        expected_duration=expected,
    )


def check_expected_duration(
    what: str, value: timedelta | float | None, timeout: timedelta | None
) -> timedelta | None:
    """``expected_duration`` as a timedelta (a number is seconds; None: the timeout), more
    than 0 and at most ``timeout`` (a run is stopped there, so a longer one would never be
    seen) or, without one, 31 days; CronSpecError naming ``what`` and the field."""
    if value is None:
        return None
    limit = timeout or MAX_EXPECTED_DURATION
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= limit.total_seconds()
    ):
        bound = "the timeout" if timeout else "31 days"
        raise CronSpecError(
            f"{what}: expected_duration must be a timedelta or seconds, more than 0 and at most "
            f"{bound} ({limit.total_seconds():g} s), got {value!r}"
        )
    return timedelta(seconds=seconds)


def check_policies(what: str, grace: timedelta | None, overlap: str) -> None:
    """``grace`` (None: the app's CHECKBEAT_CRON_GRACE) and ``overlap``; CronSpecError naming
    ``what``."""
    if grace is not None and (not isinstance(grace, timedelta) or grace < timedelta(0)):
        raise CronSpecError(f"{what}: grace must be a timedelta of 0 or more, or None")
    if overlap not in tuple(Overlap):
        allowed = ", ".join(o.value for o in Overlap)
        raise CronSpecError(f"{what}: overlap must be one of {allowed}, got {overlap!r}")


@dataclass(frozen=True)
class CronDeclaration:
    """A ``@cron`` declaration as written, what the registry holds: ``timezone`` None means
    "the ``CHECKBEAT_TIMEZONE`` of the app that reads it"."""

    task_id: str
    name: str
    spec: str
    singleton: bool = True
    per_tenant: bool = False
    timeout: timedelta = DEFAULT_TIMEOUT
    timezone: str | None = None
    queue: str | None = None
    grace: timedelta | None = None
    overlap: str = Overlap.SKIP
    expected_duration: timedelta | float | None = None

    def resolve(self, default_timezone: str) -> CronTask:
        """The task as scheduled by an app whose default timezone is ``default_timezone``."""
        return _resolve(self, self.timezone or default_timezone)

    def validate(self) -> None:
        """Fail now (at decoration) on a bad field; an undeclared timezone is the app's, which
        its settings validate."""
        self.resolve("UTC")


@lru_cache(maxsize=1024)
def _resolve(declaration: CronDeclaration, timezone: str) -> CronTask:
    return make_cron_task(
        task_id=declaration.task_id,
        name=declaration.name,
        spec=declaration.spec,
        singleton=declaration.singleton,
        per_tenant=declaration.per_tenant,
        timeout=declaration.timeout,
        timezone=timezone,
        queue=declaration.queue,
        grace=declaration.grace,
        overlap=declaration.overlap,
        expected_duration=declaration.expected_duration,
    )


def cron(
    spec: str,
    *,
    id: str | None = None,
    singleton: bool = True,
    per_tenant: bool = False,
    timeout: timedelta = DEFAULT_TIMEOUT,
    timezone: str | None = None,
    queue: str | None = None,
    name: str | None = None,
    app: Celery | None = None,
    grace: timedelta | None = None,
    overlap: str = Overlap.SKIP,
    expected_duration: timedelta | float | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Declare a cron task: ``@cron("0 3 * * *", per_tenant=True, timeout=timedelta(minutes=10))``.

    The function becomes a Celery task (a shared task, or one of ``app`` when given). A per-tenant
    task is called with ``tenant=<name>``. No retry: a failure is recorded and the next window
    runs again. ``queue`` is applied through ``task_routes`` (see :func:`route_cron_task`).
    Without ``timezone`` the task follows the ``CHECKBEAT_TIMEZONE`` of the app running it.
    ``grace``: how late a missed window may still fire (None: ``CHECKBEAT_CRON_GRACE``);
    ``overlap``: ``"skip"`` (a window while the previous run is in flight is skipped and
    recorded) or ``"allow"`` (it fires anyway). ``expected_duration`` (a timedelta or seconds,
    at most ``timeout``; None: the timeout): a monitored run longer than it makes the task's
    heartbeat check degraded (``beat/cron_monitor.py``).
    """

    def decorate(fun: Callable[..., Any]) -> Any:
        # Any worker knowing the task records its runs; the base suppresses second deliveries.
        from celery_app.cron_tasks.recording import CronRunTask

        task_name = name or f"{fun.__module__}.{fun.__name__}"
        declaration = CronDeclaration(
            task_id=id or task_name,
            name=task_name,
            spec=spec,
            singleton=singleton,
            per_tenant=per_tenant,
            timeout=timeout,
            timezone=timezone,
            queue=queue,
            grace=grace,
            overlap=overlap,
            expected_duration=expected_duration,
        )
        declaration.validate()
        declaring_registry(app).add(CRON, task_name, declaration, origin_of(fun))
        options = {"name": task_name, "max_retries": 0, "base": CronRunTask, **task_options}
        if app is not None:
            # shared=False: Celery would otherwise add the task to every app created later.
            decorate = app.task(shared=False, **options)
            return decorate(fun)  # type: ignore[no-untyped-call]  # celery-types: untyped here
        return shared_task(**options)(fun)

    return decorate


def unregister_cron(name: str, *, app: Celery | None = None) -> None:
    """Forget the declaration of task ``name`` (tests): a shared one unless ``app`` is given.

    The Celery task stays known to workers; it is only no longer scheduled.
    """
    declaring_registry(app).remove(CRON, name)


def cron_tasks(app: Celery) -> dict[str, CronTask]:
    """Every cron task the app's registry knows, by id (sorted), each in its declared timezone
    or else the app's; duplicate ids are a CronSpecError."""
    default_timezone = settings_of(app).timezone
    found: dict[str, CronTask] = {}
    for declaration in registry_of(app).cron_declarations():
        declared = declaration.resolve(default_timezone)
        other = found.get(declared.id)
        if other is not None and other.name != declared.name:
            raise CronSpecError(
                f"cron task id {declared.id!r} is declared twice ({other.name}, {declared.name})"
            )
        found[declared.id] = declared
    return dict(sorted(found.items()))


def route_cron_task(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **_: Any
) -> dict[str, str] | None:
    """Celery router (listed in ``task_routes``): send a cron task to its declared queue, as the
    registry of the task's app knows it."""
    declared = declaration_of(task)
    if declared is not None and declared.queue:
        return {"queue": declared.queue}
    return None


def declaration_of(task: Any) -> CronDeclaration | None:
    """The cron declaration of a Celery task as its app's registry knows it (None: not cron)."""
    app, name = getattr(task, "app", None), getattr(task, "name", None)
    entry = None if app is None or not name else registry_of(app).get(CRON, name)
    return None if entry is None else entry.value
