"""Every scheduled task of an app, from its three sources, as one list of :class:`CronTask`.

Why one list: the engine, ``schedule list|run|diagnose`` and the bench must agree on what
exists, so ``@cron`` declarations (the registry), Celery's own ``beat_schedule`` /
``add_periodic_task`` entries and runtime schedules (``schedule add``, in Redis) are merged
here, once, and a task id claimed by two sources is an error naming both: a window key is
per id, so two tasks under one id would silently share (and steal) each other's windows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, timedelta
from typing import TYPE_CHECKING

from celery import Celery

from celery_app.cron_tasks.celery_schedules import BeatEntry, beat_entries
from celery_app.cron_tasks.registration import (
    CronSpecError,
    CronTask,
    check_expected_duration,
    check_policies,
    cron_tasks,
)
from celery_app.names import MAX_ID, is_id
from celery_app.redis.schema import CronSource, Overlap

if TYPE_CHECKING:
    from celery_app.cron_tasks.runtime import RuntimeStore

_NOT_ID = re.compile(r"[^A-Za-z0-9_.\-]+")
_HASH_LEN = 8


class DuplicateTaskId(CronSpecError):
    """Two sources declare the same task id; the message names both."""


def id_for_entry_name(name: str) -> str:
    """A beat_schedule entry's name as a task id: itself when it is a valid id, else a stable
    slug plus a short hash of the name (``add_periodic_task`` names such as
    ``proj.echo('x')``), so the same entry keeps its keys across restarts and beats."""
    if is_id(name):
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:_HASH_LEN]
    slug = _NOT_ID.sub("-", name).strip("-.")[: MAX_ID - _HASH_LEN - 1] or "entry"
    return f"{slug}-{digest}"


def beat_task(entry: BeatEntry) -> CronTask:
    """One converted beat_schedule entry as a task (its options are sent as beat sends them)."""
    task_id = id_for_entry_name(entry.name)
    zone = entry.zone or UTC
    return CronTask(
        id=task_id,
        name=entry.task,
        spec=entry.schedule.describe(),
        schedule=entry.schedule,
        timezone=getattr(zone, "key", None) or str(zone),
        zone=zone,
        source=CronSource.BEAT_SCHEDULE,
        label="" if task_id == entry.name else entry.name,
        args=entry.args,
        kwargs=entry.kwargs,
        options=entry.options,
        entry=entry,
        # Celery's beat sends regardless of a run in flight, and `skip` needs workers that
        # record runs (a plain Celery worker never clears the in-flight key): opt in with
        # beat_policy(app, name, overlap="skip").
        overlap=Overlap.ALLOW,
    )


_POLICIES_ATTRIBUTE = "_checkbeat_beat_policies"


def beat_policy(
    app: Celery,
    entry: str,
    *,
    grace: timedelta | None = None,
    overlap: str = Overlap.ALLOW,
    expected_duration: timedelta | float | None = None,
) -> None:
    """Set the ``grace``, ``overlap`` and ``expected_duration`` of the beat_schedule entry named
    ``entry`` (an entry has no key for them: Celery's beat refuses unknown keys). Entries
    default to ``allow``, as Celery's beat sends; ``skip`` needs workers that record runs (they
    import checkbeat: a ``@cron`` task or ``celery_app.install(app)``). ``expected_duration``
    (a timedelta or seconds, up to 31 days: checkbeat puts no time limit on an entry's run; None:
    the default timeout, 5 minutes) is how long a monitored run may take before the entry's
    heartbeat check is degraded. A policy naming no entry fails beat start, so a typo cannot
    silently leave the defaults."""
    what = f"beat_policy for {entry!r}"
    check_policies(what, grace, overlap)
    expected = check_expected_duration(what, expected_duration, None)
    policies = getattr(app, _POLICIES_ATTRIBUTE, None)
    if policies is None:
        policies = {}
        setattr(app, _POLICIES_ATTRIBUTE, policies)
    policies[entry] = (grace, Overlap(overlap), expected)


def beat_schedule_tasks(app: Celery) -> list[CronTask]:
    """The app's beat_schedule and add_periodic_task entries, read after ``app.finalize()`` as
    ``celery beat`` does (entries that are not schedules raise ``BeatEntryError`` naming each),
    with the :func:`beat_policy` of each."""
    app.finalize()
    # Celery's default celery.backend_cleanup entry cleans a result backend: without one
    # (DisabledBackend) the task does nothing, so it is left out rather than sent daily.
    with_backend = bool(app.conf.result_backend)
    tasks = [beat_task(entry) for entry in beat_entries(app, include_defaults=with_backend)]
    policies = dict(getattr(app, _POLICIES_ATTRIBUTE, None) or {})
    for index, task in enumerate(tasks):
        policy = policies.pop(task.display_name, None)
        if policy is not None and task.is_custom and policy[1] == Overlap.SKIP:
            raise CronSpecError(
                f"beat_policy for {task.display_name!r}: overlap='skip' is not available for a "
                "schedule without fixed windows (its windows are its shared last runs); "
                "use overlap='allow'"
            )
        if policy is not None:
            tasks[index] = replace(
                task, grace=policy[0], overlap=policy[1], expected_duration=policy[2]
            )
    if policies:
        raise CronSpecError(
            f"beat_policy for {', '.join(map(repr, sorted(policies)))}: no beat_schedule entry "
            "of that name"
        )
    return tasks


def merge_sources(*sources: Iterable[CronTask]) -> dict[str, CronTask]:
    """One dict by id (sorted); the same id from two declarations is DuplicateTaskId."""
    found: dict[str, CronTask] = {}
    for source in sources:
        for task in source:
            other = found.get(task.id)
            if other is not None:
                raise DuplicateTaskId(
                    f"task id {task.id!r} is declared twice: by {describe_origin(other)} and "
                    f"by {describe_origin(task)}; give one of them another id"
                )
            found[task.id] = task
    return dict(sorted(found.items()))


def describe_origin(task: CronTask) -> str:
    """``@cron proj.tasks.nightly`` / ``beat_schedule entry 'x' (task proj.x)`` / ``runtime``."""
    if task.source == CronSource.BEAT_SCHEDULE:
        return f"beat_schedule entry {task.display_name!r} (task {task.name})"
    if task.source == CronSource.RUNTIME:
        return f"runtime schedule {task.id!r} (task {task.name})"
    return f"@cron {task.name}"


def code_tasks(app: Celery) -> dict[str, CronTask]:
    """The tasks declared in code: ``@cron`` and beat_schedule."""
    return merge_sources(cron_tasks(app).values(), beat_schedule_tasks(app))


def all_tasks(app: Celery, runtime: RuntimeStore | None = None) -> dict[str, CronTask]:
    """Every task of the app by id: code, then the runtime schedules; paused ones (a paused
    runtime schedule, or a code task paused by ``schedule pause``) left out."""
    code = code_tasks(app)
    if runtime is None:
        return code
    paused = runtime.paused_ids()
    firing = [task for task in code.values() if task.id not in paused]
    return merge_sources(firing, runtime.tasks(app))


def paused_code_tasks(app: Celery, runtime: RuntimeStore) -> dict[str, CronTask]:
    """The tasks declared in code that ``schedule pause`` paused, by id (for listing)."""
    paused = runtime.paused_ids()
    if not paused:
        return {}
    return {tid: task for tid, task in code_tasks(app).items() if tid in paused}
