"""Heartbeat checks: the pings a watched job sends, and the misses beat's dispatcher records.

A heartbeat check's job (``JobField.HEARTBEAT``) waits in the due index at the deadline of its
next success ping (``scheduling_core/heartbeat.py``). Every ping and every miss is a run of the
check written by ``complete.lua``, like a probe's, so states, thresholds, quorum, maintenance
windows, transitions (once), results and metrics are those of every check:

- a **success** ping is an up run (with the run's duration when a start ping came first, and its
  exit status when given), and moves the job to the next deadline;
- a **fail** ping is a down run, and moves the job to the next deadline too (the job did run);
  a ping may say when the next run is expected (``next_at``: a job with no fixed schedule, a
  cron task with a schedule class of its own), and the next deadline is then that + ``grace``;
- a **start** ping records when the run started; with ``max_duration`` the deadline comes no
  later than start + ``max_duration``, so a run that started and never finished is seen;
- with ``expected_duration``, a run longer than it is a degraded result: still running at
  start + ``expected_duration`` (a miss that points to degraded, the job then placed at the next
  deadline or start + ``max_duration``), or a success ping whose run took longer;
- a deadline that passes with no ping: ``promote.lua`` moves the job to
  ``Keys.heartbeats_late``, and beat's dispatcher (:func:`record_late`, no worker involved)
  writes a down run and places the job one period (or cron firing) later; each missed period
  is one failed run.

The job holds no lease: each write is planned from the job as read and guarded by it
(``jobs.ReadGuard``), so a ping and a miss racing each other write once each, in order, and a
miss whose job a ping moved meanwhile is dropped.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from celery_app.checks.check_state import HealthPlanner
from celery_app.checks.completion import CompleteCall, completion_reply
from celery_app.checks.definition import CheckDefinition, decode_check
from celery_app.checks.heartbeat_kind import HEARTBEAT_KIND
from celery_app.checks.jobs import (
    CompletedRun,
    JobState,
    ReadGuard,
    format_ts,
    from_unix,
    to_unix,
)
from celery_app.checks.run_contract import MAX_UNIX_S, RunRecord, RunStatus
from celery_app.errors import CheckbeatError
from celery_app.redis.clock import from_time_reply
from celery_app.redis.schema import JobField, Keys, split_job_id
from celery_app.settings import Settings
from scheduling_core import Params
from scheduling_core.health import State
from scheduling_core.heartbeat import HeartbeatSchedule

log = logging.getLogger(__name__)

#: The Celery task any app sends to ping a heartbeat check (``workers/heartbeat_ping.py``).
PING_TASK = "checkbeat.heartbeat_ping"
#: Most characters of a ping's body kept with its result (a log tail, an error message).
MAX_PING_BODY = 10_000
#: Most late jobs one dispatcher tick records (the rest wait for the next tick).
LATE_BATCH = 500
#: Guarded writes retried when the job changed between the read and the write.
_ATTEMPTS = 5


class PingKind(StrEnum):
    """What a ping says: the run succeeded, started, or failed."""

    SUCCESS = "success"
    START = "start"
    FAIL = "fail"


class PingRefused(CheckbeatError, ValueError):
    """A ping that changes nothing: ``field`` names what was wrong (uid, token, body, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Ping:
    """One ping: its kind, and what the job says about its run (all optional); ``next_at``
    (Unix s): when the job's next run is expected, in place of the check's schedule."""

    kind: PingKind = PingKind.SUCCESS
    exit_status: int | None = None
    duration_s: float | None = None
    body: str = ""
    next_at: float | None = None

    def __post_init__(self) -> None:
        if len(self.body) > MAX_PING_BODY:
            raise PingRefused("body", f"is over {MAX_PING_BODY:,} characters")
        if self.exit_status is not None and not -(2**31) <= self.exit_status < 2**31:
            raise PingRefused("exit_status", "must be a 32-bit integer")
        if self.duration_s is not None and not 0 <= self.duration_s <= 31 * 86_400:
            raise PingRefused("duration", "must be 0 to 31 days in seconds")
        if self.next_at is not None and not 0 <= self.next_at <= MAX_UNIX_S:
            raise PingRefused("next_at", "must be a Unix time in seconds up to the year 9999")


@dataclass(frozen=True)
class PingResult:
    """What a ping did: the transitions it made (to publish), per region written or not."""

    uid: str
    kind: PingKind
    transitions: list[str] = field(default_factory=list)
    written: int = 0


def heartbeat_check(client: Any, keys: Keys, uid: str) -> CheckDefinition:
    """The heartbeat check ``uid``, or PingRefused naming ``uid``."""
    h = client.hgetall(keys.check(uid)) if uid else {}
    if not h:
        raise PingRefused("uid", f"no heartbeat check {uid!r}")
    defn = decode_check(uid, h).definition
    if defn.kind != HEARTBEAT_KIND:
        raise PingRefused("uid", f"check {uid!r} is a {defn.kind} check, not a heartbeat")
    return defn


def token_matches(defn: CheckDefinition, token: str) -> bool:
    """Whether ``token`` is the check's ping token (compared in constant time)."""
    expected = str(defn.config.get("token", ""))
    return bool(expected) and hmac.compare_digest(expected.encode(), token.encode())


def record_ping(
    client: Any,
    keys: Keys,
    settings: Settings,
    uid: str,
    ping: Ping,
    *,
    token: str | None = None,
) -> PingResult:
    """Record one ping of heartbeat check ``uid`` in each of its regions. ``token``: the one
    an HTTP ping carries (None: a caller with access to the state, the CLI or a task), checked
    against the check's. PingRefused (nothing written) for an unknown uid, another kind or a
    wrong token; a disabled check's ping is accepted and changes nothing."""
    keys = keys.of_check(uid)
    defn = heartbeat_check(client, keys, uid)
    if token is not None and not token_matches(defn, token):
        raise PingRefused("token", "does not match the check's")
    result = PingResult(uid, ping.kind)
    if not defn.enabled:
        return result
    writer = _Writer(client, keys, settings, Params.from_settings(settings))
    for job_id in defn.job_ids():
        done = _ping_job(writer, defn, job_id, ping)
        if done is not None:
            written, transition = done
            result = PingResult(
                uid,
                ping.kind,
                result.transitions + ([transition] if transition else []),
                result.written + int(written),
            )
    return result


def _read(client: Any, keys: Keys, job_id: str, planner: HealthPlanner) -> tuple[dict, float]:
    """The job hash, Redis's time and the maintenance version (into ``planner``): one round
    trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.job(job_id))
    pipe.time()
    planner.prefetch(pipe)
    h, time_reply, *rest = pipe.execute()
    planner.prefetched(rest)
    return h, from_time_reply(time_reply)


#: What a ping or a miss wrote of one job: (whether it wrote a run, the transition it made), or
#: None when it wrote nothing (the job gone, no longer late, or changing at every read).
_Done = tuple[bool, str | None] | None


@dataclass(frozen=True)
class _Planned:
    """A run to write with ``complete.lua``: its record, the job's next deadline and the
    periods a miss passed over."""

    job: JobState
    record: RunRecord
    deadline: datetime
    passed: int = 0
    result: State | None = None  # the state the run reports, when not the writer's own
    ends_run: bool = False  # a success or fail ping: the run a start ping began is over


#: Plans a write from the job hash as read and Redis's time: a run, or what to answer at once.
_Plan = Callable[[dict[str, str], float], _Planned | _Done]


@dataclass(frozen=True)
class _Writer:
    """The guarded read-plan-write of every ping and every miss, in ``keys``' partition."""

    client: Any
    keys: Keys
    settings: Settings
    params: Params

    def record(self, what: str, job_id: str, result: State, plan: _Plan) -> _Done:
        """Read the job (with Redis's time and the maintenance version), plan from it and
        write the run guarded by what was read; read and plan again when the job changed
        meanwhile, at most ``_ATTEMPTS`` times. ``result``: the state the run reports."""
        for _ in range(_ATTEMPTS):
            planner = HealthPlanner(self.client, self.keys, self.settings, result)
            h, now_s = _read(self.client, self.keys, job_id, planner)
            if not h:
                return None  # disabled or deleted meanwhile
            planned = plan(h, now_s)
            if not isinstance(planned, _Planned):
                return planned
            if planned.result is not None:
                planner.result = planned.result
            done = self._write(h, planner, planned)
            if done is not None:
                return done
        log.warning("checkbeat: %s of %s not recorded: its job kept changing", what, job_id)
        return None

    def _write(self, h: dict[str, str], planner: HealthPlanner, planned: _Planned) -> _Done:
        """One guarded ``complete.lua`` write of a ping or a miss; None when the job changed
        since it was read (read again)."""
        job, record, deadline = planned.job, planned.record, planned.deadline
        now = from_unix(record.finished_at)
        state = self.params.post_exec(
            job.post_exec_input(
                duration_ms=record.duration_ms or 0.0,
                timed_out=False,
                exec_start=None,
                next_scheduled_at=deadline,
            )
        )
        health = planner(job, now)
        record = record.in_lane(job.lane)
        if health.maintenance_until is not None:
            record = record.in_maintenance()
        run = CompletedRun(job.job_id, None, state, deadline, record, health, planned.passed)
        guard = ReadGuard.of(h, planner.version)
        pipe = self.client.pipeline(transaction=False)
        CompleteCall.of(
            self.keys, run, self.settings.results_history, guard, run_ended=planned.ends_run
        ).queue(pipe)
        pipe.zrem(self.keys.heartbeats_late(), job.job_id)
        reply, _ = pipe.execute()
        return completion_reply(reply)


def _ping_job(writer: _Writer, defn: CheckDefinition, job_id: str, ping: Ping) -> _Done:
    pings = defn.heartbeat()
    assert pings is not None

    def plan(h: dict[str, str], now_s: float) -> _Planned | _Done:
        job = JobState.from_hash(job_id, h)
        now = from_unix(now_s)
        if ping.kind == PingKind.START:
            _start(
                writer.client,
                writer.keys,
                job,
                now_s,
                pings.deadline_after_start(now, from_unix(job.scheduled_at)),
            )
            return False, None
        started = float(h.get(JobField.HEARTBEAT_STARTED) or 0) or None
        record = _ping_record(job, ping, now_s, started)
        result = None
        if ping.kind == PingKind.SUCCESS and record.duration_ms is not None:
            took = timedelta(milliseconds=record.duration_ms)
            if pings.overran(took):
                result = State.DEGRADED
                record = replace(record, degraded=_overran(pings, took))
        deadline = pings.deadline_after_success(now)
        if ping.next_at is not None:
            deadline = max(now, from_unix(ping.next_at)) + pings.grace
        return _Planned(job, record, deadline, result=result, ends_run=True)

    result = State.DOWN if ping.kind == PingKind.FAIL else State.UP
    return writer.record("ping", job_id, result, plan)


def _start(client: Any, keys: Keys, job: JobState, now_s: float, deadline: datetime) -> None:
    """A start ping: when the run started, and the deadline brought forward to its end when
    its duration is watched (never pushed later: ``ZADD ... LT``)."""
    fields = {JobField.HEARTBEAT_STARTED: f"{now_s:.6f}"}
    at = to_unix(deadline)
    if at < job.scheduled_at:
        fields[JobField.SCHEDULED_AT] = format_ts(at)
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.job(job.job_id), mapping=fields)
    if at < job.scheduled_at:
        pipe.zadd(keys.due(), {job.job_id: at}, xx=True, lt=True)
    pipe.execute()


def _ping_record(job: JobState, ping: Ping, now_s: float, started: float | None) -> RunRecord:
    ran_since_start = started is not None and started <= now_s
    duration_s = ping.duration_s
    if duration_s is None and ran_since_start:
        duration_s = now_s - started  # type: ignore[operator]  # ran_since_start: not None
    detail: dict[str, Any] = {"ping": str(ping.kind)}
    if ping.exit_status is not None:
        detail["exit_status"] = ping.exit_status
    if ping.body:
        detail["body"] = ping.body
    failed = ping.kind == PingKind.FAIL
    error = None
    if failed:
        error = "the job pinged a failure" + (
            f" (exit status {ping.exit_status})" if ping.exit_status is not None else ""
        )
    return RunRecord(
        status=RunStatus.DOWN if failed else RunStatus.UP,
        region=job.region,
        finished_at=now_s,
        scheduled_at=job.scheduled_at,
        started_at=started if ran_since_start else None,
        duration_ms=None if duration_s is None else duration_s * 1000,
        error_class="heartbeat" if failed else None,
        error=error,
        detail=detail,
    )


def record_late(client: Any, keys: Keys, settings: Settings, now_s: float) -> list[str]:
    """Record a miss for every heartbeat job of ``keys``' partition whose deadline passed
    (``Keys.heartbeats_late``) and place it at its next deadline: beat's dispatcher, on a
    tick whose promote moved one there and once an interval. The transitions made (to publish)."""
    late = client.zrangebyscore(keys.heartbeats_late(), "-inf", repr(now_s), 0, LATE_BATCH)
    transitions: list[str] = []
    writer = _Writer(client, keys, settings, Params.from_settings(settings))
    definitions: dict[str, CheckDefinition | None] = {}
    for job_id in late:
        uid = split_job_id(job_id)[0]
        if uid not in definitions:
            h = client.hgetall(keys.check(uid))
            definitions[uid] = decode_check(uid, h).definition if h else None
        defn = definitions[uid]
        done = None if defn is None else _miss(writer, defn, job_id)
        if done is None:
            client.zrem(keys.heartbeats_late(), job_id)  # gone, or a ping moved it on
        elif done[1]:
            transitions.append(done[1])
    return transitions


def _miss(writer: _Writer, defn: CheckDefinition, job_id: str) -> _Done:
    pings = defn.heartbeat()
    if pings is None:
        return None  # no longer a heartbeat check: its store write re-placed the job

    def plan(h: dict[str, str], now_s: float) -> _Planned | _Done:
        if h.get(JobField.HEARTBEAT) != "1":
            return None
        job = JobState.from_hash(job_id, h)
        if job.scheduled_at > now_s:
            return None  # a ping came: not late any more
        missed = from_unix(job.scheduled_at)
        started = float(h.get(JobField.HEARTBEAT_STARTED) or 0) or None
        start = None if started is None else from_unix(started)
        deadline, passed = pings.deadline_after_miss(missed), 0
        slow = False  # still running past its expected duration: slow, not failed yet
        if start is not None and pings.is_expected_overrun(missed, start):
            slow, deadline = True, pings.deadline_after_overrun(missed, start)
        while to_unix(deadline) <= now_s:  # beat was away: every period missed is one
            deadline, passed = pings.deadline_after_miss(deadline), passed + 1
        record = RunRecord(
            status=RunStatus.DOWN,
            region=job.region,
            finished_at=now_s,
            scheduled_at=job.scheduled_at,
            error_class="heartbeat",
            error=_late_reason(pings, missed, started),
            detail={"ping": "missed"},
        )
        if slow and start is not None and passed == 0:  # passed: beat away past max_duration
            took = from_unix(now_s) - start
            record = replace(
                record, status=RunStatus.UP, error_class=None, error=None,
                degraded=_overran(pings, took, running=True), detail={"ping": "overrun"},
            )  # fmt: skip
            return _Planned(job, record, deadline, passed, result=State.DEGRADED)
        return _Planned(job, record, deadline, passed)

    return writer.record("miss", job_id, State.DOWN, plan)


def _overran(pings: HeartbeatSchedule, took: timedelta, *, running: bool = False) -> str:
    expected = pings.expected_duration.total_seconds()  # type: ignore[union-attr]  # set: only an overrun calls this
    what = "still running after" if running else "ran"
    return f"{what} {took.total_seconds():.1f} s, longer than its expected {expected:g} s"


def _late_reason(pings: HeartbeatSchedule, missed: datetime, started: float | None) -> str:
    if (
        started is not None
        and pings.max_duration is not None
        and to_unix(missed) <= started + pings.max_duration.total_seconds() + 0.01
    ):
        return (
            f"started at {from_unix(started).isoformat()} and no success within "
            f"{pings.max_duration.total_seconds():g} s"
        )
    return f"no success ping by {missed.isoformat()}"


def ping(
    app: Any,
    uid: str,
    kind: PingKind | str = PingKind.SUCCESS,
    *,
    exit_status: int | None = None,
    duration_s: float | None = None,
    body: str = "",
    token: str | None = None,
) -> PingResult:
    """Ping heartbeat check ``uid`` from a process with checkbeat's settings (a script, a
    Celery task, the CLI, the ping server) and publish the transitions it made. ``kind``:
    ``success`` (the default), ``start`` or ``fail``. PingRefused names what was refused
    (``uid``, ``token``, ``kind``, ``body``, ...); nothing is written then."""
    from celery_app.checks.transitions import claim_and_publish
    from celery_app.factory import settings_of
    from celery_app.redis.client import get_redis
    from celery_app.redis.clock import server_time
    from celery_app.redis.keyspace import state_keys

    try:
        what = PingKind(kind)
    except ValueError:
        raise PingRefused("kind", f"{kind!r} is not one of success, start, fail") from None
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings).of_check(uid)
    done = record_ping(
        client,
        keys,
        settings,
        uid,
        Ping(what, exit_status=exit_status, duration_s=duration_s, body=body),
        token=token,
    )
    if done.transitions:
        try:
            claim_and_publish(app, client, keys, settings, server_time(client), done.transitions)
        except Exception:  # in the outbox: beat's sweep publishes it
            log.exception("checkbeat: publishing the transitions of %s failed; beat retries", uid)
    return done
