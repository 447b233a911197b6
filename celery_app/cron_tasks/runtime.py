"""Runtime schedules: tasks scheduled from a shell or a program (``schedule add``), kept in Redis.

Why Redis: every beat must see a change within one tick, without a restart, and fire it with
the same window keys as a task declared in code. A schedule is one hash per id
(:class:`RuntimeField` fields, values as validated text) plus the set of ids; every change
INCRs one version counter, so a beat reads one GET per tick and reloads only when it moved.

Everything is validated before anything is written (:func:`validate_schedule`): a bad spec,
zone, JSON, duration or name raises :class:`ScheduleInputError` naming the field, and Redis is
untouched. A runtime schedule may not take the id of a task declared in code (``@cron`` or
``beat_schedule``): :func:`add_schedule` refuses it, naming the code declaration.

A task declared in code can be paused too (:func:`pause_schedule`): its id goes into one set
(``Keys.cron_paused``), an override of the code, and the version moves, so every beat drops it
from its list at its next tick (:func:`celery_app.cron_tasks.task_sources.all_tasks` leaves it out)
and takes it back on :func:`resume_schedule`.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from celery import Celery

from celery_app.cron_tasks.celery_schedules import MIN_INTERVAL, Interval
from celery_app.cron_tasks.registration import DEFAULT_TIMEOUT, CronTask
from celery_app.errors import CheckbeatError
from celery_app.factory import settings_of
from celery_app.input_limits import InputLimitError, check_value, loads_json
from celery_app.names import ID_RULE, MAX_ID, is_id, refused_characters
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronSource, CronStatsField, Keys, Overlap, RuntimeField
from celery_app.wall_clock import clock_from_env
from scheduling_core.cron import CronError, parse

__all__ = [
    "RuntimeSchedule",
    "RuntimeStore",
    "ScheduleInputError",
    "add_schedule",
    "parse_duration",
    "pause_schedule",
    "remove_schedule",
    "resume_schedule",
    "runtime_store",
    "update_schedule",
    "validate_schedule",
]

#: Longest grace or timeout a runtime schedule may have (as CHECKBEAT_CRON_GRACE's bound).
MAX_DURATION = timedelta(days=1)
#: Longest interval (``every``); a longer period is a cron spec's job. Any duration text past
#: 100 years is refused as such before it becomes a timedelta (which overflows near 2.7 million
#: years) or a window end past the year 9999.
MAX_EVERY = timedelta(days=366)
#: The most ``args`` or ``kwargs`` may weigh as JSON: every firing stores and sends them.
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_DURATION_S = 100 * 366 * 86400.0
DURATION_RULE = (
    "a number of seconds or <number><unit> with units ms, s, m, h, d (e.g. 90, 20s, 1h30m)"
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,199}")
_QUEUE = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The fields ``update`` may change (everything but the id).
CHANGEABLE = (
    "task",
    "cron",
    "every",
    "args",
    "kwargs",
    "queue",
    "per_tenant",
    "timezone",
    "timeout",
    "grace",
    "overlap",
    "expected_duration",
)


class ScheduleInputError(CheckbeatError, ValueError):
    """A runtime schedule field is invalid (``field`` names it); nothing was written."""

    field: str  # always named

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ScheduleConflict(CheckbeatError, ValueError):
    """The id is taken (by code, or by another runtime schedule for ``add``) or unknown."""


def parse_duration(value: Any, field: str) -> timedelta:
    """``90``, ``"90"``, ``"20s"``, ``"1h30m"``, ``"500ms"`` or a timedelta, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ScheduleInputError(field, f"must be {DURATION_RULE}, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) > MAX_DURATION_S:
            raise ScheduleInputError(field, f"must be {DURATION_RULE}, got {_shown(value)}")
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ScheduleInputError(field, f"must be {DURATION_RULE}, got {type(value).__name__}")
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = list(_DURATION_PART.finditer(text))
        if not text or "".join(m.group(0) for m in parts) != text:
            _bad(field, text)
        seconds = sum(float(m.group(1)) * _UNIT_S[m.group(2)] for m in parts)
    if not math.isfinite(seconds) or abs(seconds) > MAX_DURATION_S:  # timedelta would overflow
        _bad(field, text)
    return timedelta(seconds=seconds)


def _shown(value: Any) -> str:
    """``repr(value)``, a long one cut (an integer of thousands of digits)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "a huge number"
    return text if len(text) <= 60 else f"{text[:57]}..."


def _bad(field: str, text: str) -> timedelta:
    raise ScheduleInputError(field, f"must be {DURATION_RULE}, got {_shown(text)}")


def _seconds_text(value: timedelta) -> str:
    return f"{value.total_seconds():g}"


@dataclass(frozen=True)
class RuntimeSchedule:
    """One validated runtime schedule (exactly one of ``cron`` and ``every`` is set)."""

    id: str
    task: str
    cron: str | None = None
    every: timedelta | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None
    queue: str | None = None
    per_tenant: bool = False
    timezone: str | None = None  # None: the app's CHECKBEAT_TIMEZONE
    timeout: timedelta = DEFAULT_TIMEOUT
    grace: timedelta | None = None  # None: the app's CHECKBEAT_CRON_GRACE
    overlap: str = Overlap.SKIP
    paused: bool = False
    expected_duration: timedelta | None = None  # None: the timeout

    @property
    def schedule_text(self) -> str:
        # a schedule has a cron spec or an interval (validated when written)
        every = cast(timedelta, self.every)
        return self.cron if self.cron is not None else Interval(every).describe()

    def to_fields(self) -> dict[str, str]:
        return {
            RuntimeField.TASK: self.task,
            RuntimeField.CRON: self.cron or "",
            RuntimeField.EVERY: "" if self.every is None else _seconds_text(self.every),
            RuntimeField.ARGS: json.dumps(list(self.args)),
            RuntimeField.KWARGS: json.dumps(dict(self.kwargs or {})),
            RuntimeField.QUEUE: self.queue or "",
            RuntimeField.PER_TENANT: "1" if self.per_tenant else "0",
            RuntimeField.TIMEZONE: self.timezone or "",
            RuntimeField.TIMEOUT: _seconds_text(self.timeout),
            RuntimeField.GRACE: "" if self.grace is None else _seconds_text(self.grace),
            RuntimeField.OVERLAP: str(self.overlap),
            RuntimeField.PAUSED: "1" if self.paused else "0",
            RuntimeField.EXPECTED_DURATION: (
                "" if self.expected_duration is None else _seconds_text(self.expected_duration)
            ),
        }

    @classmethod
    def from_fields(cls, task_id: str, fields: Mapping[str, str]) -> RuntimeSchedule:
        """Read back what :meth:`to_fields` wrote (validated again: Redis is not trusted)."""
        get = fields.get
        return validate_schedule(
            task_id,
            task=get(RuntimeField.TASK, ""),
            cron=get(RuntimeField.CRON) or None,
            every=get(RuntimeField.EVERY) or None,
            args=get(RuntimeField.ARGS) or "[]",
            kwargs=get(RuntimeField.KWARGS) or "{}",
            queue=get(RuntimeField.QUEUE) or None,
            per_tenant=get(RuntimeField.PER_TENANT) == "1",
            timezone=get(RuntimeField.TIMEZONE) or None,
            timeout=get(RuntimeField.TIMEOUT) or DEFAULT_TIMEOUT,
            grace=get(RuntimeField.GRACE) or None,
            overlap=get(RuntimeField.OVERLAP) or Overlap.SKIP,
            paused=get(RuntimeField.PAUSED) == "1",
            expected_duration=get(RuntimeField.EXPECTED_DURATION) or None,
        )

    def as_task(self, default_timezone: str) -> CronTask:
        """The schedule as the engine fires it (a cron spec is read by our parser, as
        ``@cron``'s; an interval counts its windows from the first beat that saw it, as a
        beat_schedule interval)."""
        timezone = self.timezone or default_timezone
        every = cast(timedelta, self.every)  # without a cron spec, an interval (validated)
        schedule = parse(self.cron) if self.cron is not None else Interval(every)
        return CronTask(
            id=self.id,
            name=self.task,
            spec=self.schedule_text,
            schedule=schedule,
            per_tenant=self.per_tenant,
            timeout=self.timeout,
            timezone=timezone,
            queue=self.queue,
            zone=ZoneInfo(timezone),
            source=CronSource.RUNTIME,
            grace=self.grace,
            overlap=self.overlap,
            expected_duration=self.expected_duration,
            args=self.args,
            kwargs=dict(self.kwargs or {}),
        )


def validate_schedule(
    task_id: Any,
    *,
    task: Any,
    cron: Any = None,
    every: Any = None,
    args: Any = (),
    kwargs: Any = None,
    queue: Any = None,
    per_tenant: Any = False,
    timezone: Any = None,
    timeout: Any = DEFAULT_TIMEOUT,
    grace: Any = None,
    overlap: Any = Overlap.SKIP,
    paused: bool = False,
    expected_duration: Any = None,
) -> RuntimeSchedule:
    """Every field checked; the first bad one raises ScheduleInputError naming it.

    ``args``/``kwargs`` may be JSON text (the CLI's) or values that JSON can carry (a message
    body is JSON); durations follow :func:`parse_duration`.
    """
    if not is_id(task_id):
        raise ScheduleInputError("id", f"{task_id!r} is not a valid id: {ID_RULE}")
    if not isinstance(task, str) or not _NAME.fullmatch(task) or refused_characters(task):
        raise ScheduleInputError(
            "task",
            f"{task!r} is not a task name (a dotted Celery task name of at most {MAX_ID} "
            "characters: letters, digits, '_', '.', ':' or '-')",
        )
    if (cron is None) == (every is None):
        raise ScheduleInputError("cron/every", "give exactly one of cron (a spec) and every")
    interval: timedelta | None = None
    if cron is not None:
        if not isinstance(cron, str):
            raise ScheduleInputError("cron", f"must be a cron spec string, got {cron!r}")
        try:
            parse(cron)
        except CronError as exc:
            raise ScheduleInputError("cron", f"invalid spec {cron!r}: {exc}") from None
    else:
        interval = parse_duration(every, "every")
        if not MIN_INTERVAL <= interval <= MAX_EVERY:
            raise ScheduleInputError(
                "every", f"must be from 1 second to 366 days (longer: --cron), got {_shown(every)}"
            )
    parsed_args = _json_value("args", args, (list, tuple))
    parsed_kwargs = _json_value("kwargs", kwargs if kwargs is not None else {}, (dict,))
    if any(not isinstance(k, str) for k in parsed_kwargs):
        raise ScheduleInputError("kwargs", "keys must be strings")
    if per_tenant and "tenant" in parsed_kwargs:
        raise ScheduleInputError("kwargs", "a per-tenant task is given 'tenant' itself")
    if queue is not None and (not isinstance(queue, str) or not _QUEUE.fullmatch(queue)):
        raise ScheduleInputError(
            "queue", f"{queue!r} is not a queue name (1-200 letters, digits, '_', '.', ':', '-')"
        )
    if not isinstance(per_tenant, bool):
        raise ScheduleInputError("per_tenant", f"must be true or false, got {per_tenant!r}")
    if timezone is not None:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ScheduleInputError(
                "timezone", f"unknown timezone {timezone!r}; use an IANA name such as UTC"
            ) from None
    timeout_d = parse_duration(timeout, "timeout")
    if not timedelta(0) < timeout_d <= MAX_DURATION:
        raise ScheduleInputError(
            "timeout", f"must be more than 0 and at most 1 day, got {timeout!r}"
        )
    grace_d = None if grace is None else parse_duration(grace, "grace")
    if grace_d is not None and not timedelta(0) <= grace_d <= MAX_DURATION:
        raise ScheduleInputError("grace", f"must be from 0 to 1 day, got {grace!r}")
    if overlap not in tuple(Overlap):
        allowed = ", ".join(o.value for o in Overlap)
        raise ScheduleInputError("overlap", f"must be one of {allowed}, got {overlap!r}")
    expected = None
    if expected_duration is not None:
        expected = parse_duration(expected_duration, "expected_duration")
        if not timedelta(0) < expected <= timeout_d:
            raise ScheduleInputError(
                "expected_duration",
                f"must be more than 0 and at most the timeout ({_seconds_text(timeout_d)}s), "
                f"got {_shown(expected_duration)}",
            )
    return RuntimeSchedule(
        id=task_id,
        task=task,
        cron=cron,
        every=interval,
        args=tuple(parsed_args),
        kwargs=dict(parsed_kwargs),
        queue=queue,
        per_tenant=per_tenant,
        timezone=timezone,
        timeout=timeout_d,
        grace=grace_d,
        overlap=Overlap(overlap),
        paused=paused,
        expected_duration=expected,
    )


def _json_value(field: str, value: Any, types: tuple[type, ...]) -> Any:
    """``value`` (JSON text or a value) within the bounds of every JSON input (nesting, numbers,
    size: :mod:`celery_app.input_limits`; a message body is JSON)."""
    kind = "a JSON list" if list in types else "a JSON object"
    try:
        if isinstance(value, str):
            try:
                value = loads_json(value, field)
            except json.JSONDecodeError as exc:
                raise ScheduleInputError(field, f"must be {kind}: {exc}") from None
        else:
            check_value(value, field)
    except InputLimitError as exc:
        raise ScheduleInputError(exc.field, exc.problem) from None
    if not isinstance(value, types):
        raise ScheduleInputError(field, f"must be {kind}, got {type(value).__name__}")
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ScheduleInputError(field, f"must be {kind} (a message body is JSON): {exc}") from None
    if size > MAX_ARGUMENTS_BYTES:
        raise ScheduleInputError(
            field, f"is {size:,} bytes as JSON; at most {MAX_ARGUMENTS_BYTES:,} are allowed"
        )
    return value


class RuntimeStore:
    """The runtime schedules under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def version(self) -> str | None:
        """The change counter: a beat reloads when it differs from what it last read."""
        value = self.client.get(self.keys.cron_runtime_version())
        return value.decode() if isinstance(value, bytes) else value

    def get(self, task_id: str) -> RuntimeSchedule | None:
        fields = self.client.hgetall(self.keys.cron_runtime(task_id))
        if not fields:
            return None
        return RuntimeSchedule.from_fields(task_id, _decoded(fields))

    def schedules(self) -> list[RuntimeSchedule]:
        """Every runtime schedule, by id; an entry that no longer validates is skipped (it was
        validated when written; a hand-edited hash must not stop the beats)."""
        ids = sorted(_text(i) for i in self.client.smembers(self.keys.cron_runtime_ids()))
        pipe = self.client.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.keys.cron_runtime(task_id))
        found = []
        for task_id, fields in zip(ids, pipe.execute(), strict=True):
            if not fields:
                continue
            try:
                found.append(RuntimeSchedule.from_fields(task_id, _decoded(fields)))
            except ScheduleInputError:
                continue
        return found

    def paused_ids(self) -> set[str]:
        """Ids of tasks declared in code that ``schedule pause`` paused."""
        return {_text(i) for i in self.client.smembers(self.keys.cron_paused())}

    def set_code_paused(self, task_id: str, paused: bool) -> None:
        """Pause or resume a task declared in code, and move the version (one transaction)."""
        pipe = self.client.pipeline(transaction=True)
        if paused:
            pipe.sadd(self.keys.cron_paused(), task_id)
        else:
            pipe.srem(self.keys.cron_paused(), task_id)
        pipe.incr(self.keys.cron_runtime_version())
        pipe.execute()

    def paused_through(self, task_id: str, until: float) -> None:
        """A resume: the windows starting before ``until`` (the task's first window after the
        resume) were not fired by design, so no beat may report them as a gap
        (``cron_gaps.lua`` records nothing before the task's ``last_gap_to``)."""
        key = self.keys.cron_stats(task_id)
        recorded = float(self.client.hget(key, CronStatsField.LAST_GAP_TO) or 0)
        if until > recorded:
            self.client.hset(key, CronStatsField.LAST_GAP_TO, until)

    def tasks(self, app: Celery) -> list[CronTask]:
        """The schedules that fire (not paused), as tasks of ``app``."""
        default_timezone = settings_of(app).timezone
        return [s.as_task(default_timezone) for s in self.schedules() if not s.paused]

    def write(self, schedule: RuntimeSchedule, *, create: bool) -> None:
        """Store ``schedule`` and move the version, in one transaction; ``create`` refuses an
        existing id, otherwise the id must exist (ScheduleConflict, nothing written)."""
        key = self.keys.cron_runtime(schedule.id)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    exists = bool(pipe.exists(key))
                    if create and exists:
                        raise ScheduleConflict(
                            f"runtime schedule {schedule.id!r} already exists; "
                            "use `schedule update` to change it"
                        )
                    if not create and not exists:
                        raise ScheduleConflict(f"no runtime schedule {schedule.id!r}")
                    pipe.multi()
                    pipe.delete(key)
                    fields = schedule.to_fields()
                    pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # str keys are fine
                    pipe.sadd(self.keys.cron_runtime_ids(), schedule.id)
                    pipe.incr(self.keys.cron_runtime_version())
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def remove(self, task_id: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys.cron_runtime(task_id))
        pipe.srem(self.keys.cron_runtime_ids(), task_id)
        pipe.incr(self.keys.cron_runtime_version())
        deleted = pipe.execute()[0]
        if not deleted:
            raise ScheduleConflict(f"no runtime schedule {task_id!r}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decoded(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in fields.items()}


def runtime_store(app: Celery) -> RuntimeStore:
    settings = settings_of(app)
    return RuntimeStore(get_redis(settings.redis_url, settings), state_keys(settings))


def _refuse_code_shadow(app: Celery, task_id: str) -> None:
    from celery_app.cron_tasks.task_sources import code_tasks, describe_origin

    app.loader.import_default_modules()
    declared = code_tasks(app).get(task_id)
    if declared is not None:
        raise ScheduleConflict(
            f"id {task_id!r} is already declared in code by {describe_origin(declared)}; "
            "a runtime schedule may not shadow it: choose another id"
        )


def _require_known_task(app: Celery, task: str) -> None:
    """Refuse a task name ``app`` does not know (a typo, or ``os.system``): found at write time,
    not by the worker discarding every firing. ``remote_task=True`` (``--remote-task``) skips
    this for a task registered only in the workers' code."""
    app.loader.import_default_modules()
    if task in app.tasks:
        return
    known = sorted(name for name in app.tasks if not name.startswith("celery."))
    close = difflib.get_close_matches(task, known, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ScheduleInputError(
        "task",
        f"{task!r} is not a task this app knows ({hint}{len(known)} known; "
        "a task registered only on the workers needs --remote-task)",
    )


def add_schedule(
    app: Celery, task_id: str, *, remote_task: bool = False, **fields: Any
) -> RuntimeSchedule:
    """Schedule ``task`` at runtime: ``add_schedule(app, "ping", task="proj.ping",
    every="20s")``. Every beat fires it from its next tick on; nothing is written on error.
    ``task`` must be a task of ``app`` unless ``remote_task`` says it lives only on the
    workers."""
    schedule = validate_schedule(task_id, **fields)
    if not remote_task:
        _require_known_task(app, schedule.task)
    _refuse_code_shadow(app, task_id)
    runtime_store(app).write(schedule, create=True)
    return schedule


def update_schedule(
    app: Celery, task_id: str, *, remote_task: bool = False, **changes: Any
) -> RuntimeSchedule:
    """Change some fields of a runtime schedule (``cron=`` replaces ``every`` and back); a new
    ``task`` is checked as :func:`add_schedule` checks it."""
    unknown = sorted(set(changes) - set(CHANGEABLE))
    if unknown:
        raise ScheduleInputError(unknown[0], f"cannot be changed; fields: {', '.join(CHANGEABLE)}")
    store = runtime_store(app)
    current = store.get(task_id)
    if current is None:
        raise ScheduleConflict(f"no runtime schedule {task_id!r}")
    merged: dict[str, Any] = {k: v for k, v in asdict(current).items() if k != "id"}
    if "cron" in changes and changes["cron"] is not None:
        merged["every"] = None
    if "every" in changes and changes["every"] is not None:
        merged["cron"] = None
    merged.update(changes)
    schedule = validate_schedule(task_id, **merged)
    if "task" in changes and not remote_task:
        _require_known_task(app, schedule.task)
    store.write(schedule, create=False)
    return schedule


def remove_schedule(app: Celery, task_id: str) -> None:
    """Stop and forget a runtime schedule (its run history stays, as a removed @cron's)."""
    runtime_store(app).remove(task_id)


@dataclass(frozen=True)
class Paused:
    """What pause or resume changed: ``what`` describes the task (``runtime schedule 'x'`` or
    its code declaration), ``paused`` its state now."""

    id: str
    what: str
    paused: bool


def _set_paused(app: Celery, task_id: str, paused: bool, now: datetime | None = None) -> Paused:
    from celery_app.cron_tasks.task_sources import code_tasks, describe_origin

    store = runtime_store(app)
    current = store.get(task_id)
    if current is not None:
        what = f"runtime schedule {task_id!r} ({current.task} {current.schedule_text})"
        task = current.as_task(settings_of(app).timezone)
    else:
        app.loader.import_default_modules()
        declared = code_tasks(app).get(task_id)
        if declared is None:
            raise ScheduleConflict(f"no scheduled task {task_id!r} (see `schedule list`)")
        what, task = describe_origin(declared), declared
    if not paused:
        # Every window that starts before the first one after the resume was paused.
        at = (now or clock_from_env().now()).astimezone(UTC)
        store.paused_through(task_id, (task.next_fire(at) or at).timestamp())
    if current is not None:
        store.write(replace(current, paused=paused), create=False)
    else:
        store.set_code_paused(task_id, paused)
    return Paused(task_id, what, paused)


def pause_schedule(app: Celery, task_id: str) -> Paused:
    """Fire nothing of task ``task_id`` until :func:`resume_schedule`: a runtime schedule keeps
    its definition, a task declared in code (``@cron``, ``beat_schedule``) is overridden in
    Redis; every beat sees it at its next tick."""
    return _set_paused(app, task_id, True)


def resume_schedule(app: Celery, task_id: str, *, now: datetime | None = None) -> Paused:
    """Fire task ``task_id`` again from its next window; the windows it had while paused
    (until ``now``, the app's clock by default) are no gap."""
    return _set_paused(app, task_id, False, now)
