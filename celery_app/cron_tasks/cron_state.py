"""Cron state in Redis: the per-window claim, the in-flight key, run records and counters.

Why here and not in beat: the beat fires, the worker records the run (signals) and the CLI runs a
task now through the same lock, and those three never import each other. Every write of a batch
is one round trip (a pipeline of Lua calls over chunks), never one per task.

Layout (see :class:`celery_app.redis.schema.Keys`): ``cron_window`` (SET NX PX, one per task,
tenant, window), ``cron_inflight`` (TTL bounds a run that never reports back), ``cron_state``
(hash per task and tenant), ``cron_stats`` (hash per task), ``cron_pending`` (claimed, publish
not yet confirmed) and ``cron_failing`` (pairs whose last run failed). Field names are the
``Cron*Field`` enums of the schema; the scripts are ``celery_app/redis/lua/cron_*.lua``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import uuid4

import redis

from celery_app.cron_tasks.registration import GLOBAL_TENANT, WINDOW, CronTask
from celery_app.redis.replication import queue_wait, run_replicated, took_wait
from celery_app.redis.schema import (
    CRON_CLAIM_LEASE_S,
    CronClaimCode,
    CronClaimKind,
    CronGapField,
    CronOutcome,
    CronPendingField,
    CronStateField,
    CronStatsField,
    Keys,
    Overlap,
)
from celery_app.redis.scripts import run_script

CHUNK = 500  # entries per claim call (5 KEYS each); one pipeline carries all chunks
GAPS_KEPT = 1000  # gap records kept, newest first
PAIR_KEYS_KEPT = 200_000  # (task, tenant) key sets kept by a store; past this it starts over
#: One claim entry: (its index, task, tenant, "<kind>:<in-flight ttl ms>"), see cron_claim.lua.
_Entry = tuple[int, CronTask, str, str]

_CODES = {str(code.value): code for code in CronClaimCode}  # cron_claim.lua answers digits
# Read as state hash fields by lost_claims (a lost claim fired, and no run of it started).
_SENT_AND_RUN = (CronStateField.LAST_SENT_AT, CronStateField.LAST_RUN_WINDOW)


@dataclass(frozen=True)
class Early:
    """A run start refused because its window has not started on the server's clock: nothing
    was written; wait ``wait_s`` (measured on that clock) and ask again."""

    wait_s: float


@dataclass(frozen=True)
class Claim:
    """The outcome of one claim round trip: a code per request, and its pending record."""

    codes: list[CronClaimCode]
    batch: str

    def __getitem__(self, index: int) -> CronClaimCode:
        return self.codes[index]

    def __len__(self) -> int:
        return len(self.codes)

    def __iter__(self) -> Iterator[CronClaimCode]:
        return iter(self.codes)


@dataclass(frozen=True)
class Gap:
    """Windows ``[start, end)`` of a task nobody fired: ``count`` of them (0: not counted),
    ``period`` seconds apart (0: unevenly), one record per tenant of ``tenants`` (none: one
    record for the task), ``note`` e.g. why the tenant is ``*``; ``if_seen``: only if some
    caller handled a window of the task before (a first start's catch-up is no loss)."""

    task: CronTask
    start: datetime
    end: datetime
    count: int = 0
    period: float = 0.0
    tenants: tuple[str, ...] = ()
    note: str = ""
    if_seen: bool = False


@dataclass(frozen=True)
class PendingClaim:
    """A claim record taken over from ``Keys.cron_pending`` (see :meth:`CronStore.take_over`)."""

    batch: str
    owner: str
    at: float
    members: tuple[str, ...]
    manual: bool


@dataclass(frozen=True)
class FireRequest:
    """One (task, tenant, window) to fire; ``tenant`` is GLOBAL_TENANT for global tasks."""

    task: CronTask
    tenant: str
    window: datetime  # window start, UTC (a custom schedule's: when it was found due)
    #: A custom schedule's window id and the shared last run it was found due after (read from
    #: ``Keys.cron_ref``): every beat that found it due names the same window.
    wid: str = ""
    ref: str = ""
    #: The window's id and the request's name in claim records (``task|tenant|window id``),
    #: written at creation: every request is claimed and sent by them.
    window_id: str = field(init=False, compare=False, repr=False)
    member: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        wid = self.wid or self.task.window_id_of(self.window)
        object.__setattr__(self, "window_id", wid)
        object.__setattr__(self, "member", f"{self.task.id}|{self.tenant}|{wid}")


def anchored(task: CronTask, ref: str | None) -> CronTask:
    """``task`` as beats fire it: an interval's windows counted from its reference instant
    (``Keys.cron_ref``, as stored), when it has one; any other task as it is."""
    if ref is None or not task.is_interval:
        return task
    return task.with_anchor(datetime.fromtimestamp(float(ref), UTC))


def _text(value: str | bytes) -> str:
    """A value as text (a client may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


def split_member(member: str) -> tuple[str, str, str]:
    task_id, tenant, wid = member.split("|")
    return task_id, tenant, wid


def skipped_window_owner(owner: str) -> str:
    """The window key's value when ``owner`` consumed the window as skipped (previous run still
    in flight): run-now and diagnose show who took a window from it."""
    return f"skipped:{owner}"


def parse_window_id(wid: str) -> datetime:
    """The window start a window id names: a cron minute id (``...T18:30Z``) or an interval's
    second id (``...T18:30:20Z``)."""
    return datetime.fromisoformat(wid).astimezone(UTC)


def window_deadline(window: datetime, grace: timedelta, length: timedelta = WINDOW) -> datetime:
    """When a window's grace ends: nothing of it may be sent, or start, after this."""
    return window + length + grace


def task_deadline(task: CronTask, window: datetime, default_grace: timedelta) -> datetime:
    """:func:`window_deadline` of one of ``task``'s windows, with the task's own grace."""
    return window + task.window_length + task.grace_or(default_grace)


def gap_record(
    task_id: str, start: datetime, end: datetime, now: datetime, detector: str, tenant: str
) -> str:
    """A gap record as the JSON ``Keys.cron_gaps`` holds (``cron_gaps.lua`` writes the same
    fields, without the tenant)."""
    return json.dumps(
        {
            CronGapField.TASK: task_id,
            CronGapField.TENANT: tenant,
            CronGapField.FROM: start.timestamp(),
            CronGapField.TO: end.timestamp(),
            CronGapField.DETECTED_AT: now.timestamp(),
            CronGapField.DETECTOR: detector,
        }
    )


class CronStore:
    """Reads and writes cron state for one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys, grace: timedelta) -> None:
        self.client = client
        self.keys = keys
        self.grace = grace
        # (task id, tenant, fingerprint) -> the keys of the pair that are the same every window
        self._pairs: dict[tuple[str, str, str], tuple[str, str, str, str]] = {}

    # --- beat / run-now -------------------------------------------------------------------
    def _pair_keys(self, task: CronTask, tenant: str) -> tuple[str, str, str, str]:
        """The four keys ``cron_claim.lua`` takes per entry after its window key (in-flight,
        state, stats, reference): built once per (task, tenant, schedule), not per window."""
        memo = (task.id, tenant, task.fingerprint)
        found = self._pairs.get(memo)
        if found is None:
            if len(self._pairs) >= PAIR_KEYS_KEPT:
                self._pairs.clear()
            keys = self.keys
            found = self._pairs[memo] = (
                keys.cron_inflight(task.id, tenant),
                keys.cron_state(task.id, tenant),
                keys.cron_stats(task.id),
                keys.cron_ref(task.id, task.fingerprint),
            )
        return found

    def note_refs(self, tasks: Sequence[CronTask], at: datetime) -> dict[str, str]:
        """Each task's reference instant (``Keys.cron_ref``), set to ``at`` (rounded up to the
        second, so interval windows keep whole-second ids) where no beat had set one: the
        first instant a beat saw the task with this schedule (``0`` for a task that fired
        before references were kept: see ``cron_ref.lua``). One round trip; every beat reads
        the value the first one wrote."""
        if not tasks:
            return {}
        stamp = math.ceil(at.timestamp())
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(tasks), CHUNK):
            chunk = tasks[start : start + CHUNK]
            keys: list[str] = []
            for task in chunk:
                keys += [
                    self.keys.cron_ref(task.id, task.fingerprint),
                    self.keys.cron_stats(task.id),
                ]
            run_script(pipe, "cron_ref", keys, [stamp, *(task.fingerprint for task in chunk)])
        answers = [_text(value) for chunk in pipe.execute() for value in chunk]
        return {task.id: value for task, value in zip(tasks, answers, strict=True)}

    def anchored(self, tasks: Mapping[str, CronTask]) -> dict[str, CronTask]:
        """``tasks`` (by id) with their intervals' windows where the beats have them, so
        ``schedule list`` shows the next firing and run-now takes the window a beat would."""
        refs = self.read_refs([task for task in tasks.values() if task.is_interval])
        return {task_id: anchored(task, refs.get(task_id)) for task_id, task in tasks.items()}

    def read_refs(self, tasks: Sequence[CronTask]) -> dict[str, str]:
        """The reference instants (as stored) of ``tasks`` that have one; readers that must not
        write (``schedule list``) use this, the engine :meth:`note_refs`."""
        if not tasks:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for task in tasks:
            pipe.get(self.keys.cron_ref(task.id, task.fingerprint))
        found = zip(tasks, pipe.execute(), strict=True)
        return {t.id: _text(v) for t, v in found if v is not None}

    def claim(
        self,
        requests: Sequence[FireRequest],
        *,
        now: datetime,
        owner: str,
        manual: bool = False,
        marks: Iterable[tuple[CronTask, datetime]] = (),
    ) -> Claim:
        """Take the window keys of ``requests`` (one round trip) and return a code for each.

        FIRE: this caller must send it (its in-flight key is set; the claim is listed as
        pending until :meth:`confirm_sent` or :meth:`record_send_failure`).
        TAKEN: another replica or a manual run already has this window. IN_FLIGHT: the previous
        run has not finished; the window is consumed and recorded as skipped. ``marks`` record
        that a task's window was handled even with no tenant to fire for.
        """
        # The entries (requests, then marks) go in script calls of one (window, window id,
        # deadline) each: a crontab's and an interval's window may start at the same instant
        # under different ids and lengths.
        by_window: dict[tuple[datetime, str, datetime], list[_Entry]] = {}
        # per (window, kind of window, length, grace, custom wid): its by_window list
        groups: dict[tuple[datetime, bool, timedelta, timedelta | None, str], list[_Entry]] = {}
        # per (window, length, grace, timeout, kind): the entry's "<kind>:<in-flight ttl ms>"
        specs: dict[tuple[datetime, timedelta, timedelta | None, timedelta, str], str] = {}

        def group_of(task: CronTask, window: datetime, custom_wid: str) -> list[_Entry]:
            # a crontab's and a 60 s interval's windows differ in id only
            key = (window, task.is_interval, task.window_length, task.grace, custom_wid)
            group = groups.get(key)
            if group is None:
                deadline = task_deadline(task, window, self.grace)
                wid = custom_wid or task.window_id_of(window)
                group = groups[key] = by_window.setdefault((window, wid, deadline), [])
            return group

        for index, req in enumerate(requests):
            task = req.task
            if task.is_custom and req.ref:  # a run-now has no last run: a plain keyed window
                group_of(task, req.window, req.wid).append(
                    (index, task, req.tenant, f"{CronClaimKind.CUSTOM}:{req.ref}")
                )
                continue
            if not task.singleton:
                kind = CronClaimKind.NON_SINGLETON
            elif task.overlap == Overlap.ALLOW:
                kind = CronClaimKind.OVERLAP
            else:
                kind = CronClaimKind.SINGLETON
            window = req.window
            memo = (window, task.window_length, task.grace, task.timeout, kind)
            spec = specs.get(memo)
            if spec is None:
                deadline = task_deadline(task, window, self.grace)
                # A message may wait until the deadline, then run up to the hard limit.
                left_ms = (deadline - now).total_seconds() * 1000
                inflight_ms = max(1000, int(left_ms + task.hard_time_limit * 1000))
                spec = specs[memo] = f"{kind}:{inflight_ms}"
            group_of(task, window, "").append((index, task, req.tenant, spec))
        mark = f"{CronClaimKind.MARK}:0"
        for index, (task, window) in enumerate(marks, len(requests)):
            group_of(task, window, "").append((index, task, GLOBAL_TENANT, mark))
        pipe = self.client.pipeline(transaction=False)
        batch = f"{owner}|{now.timestamp():.6f}|{uuid4().hex[:8]}"
        if requests:
            # Written before the keys are taken, in the same round trip: if this process dies
            # before publishing, diagnose finds the claim here instead of a silent loss.
            record = {
                CronPendingField.OWNER: owner,
                CronPendingField.AT: now.timestamp(),
                CronPendingField.MEMBERS: [req.member for req in requests],
                CronPendingField.MANUAL: manual,
            }
            pipe.hset(self.keys.cron_pending(), batch, json.dumps(record))
            pipe.zadd(self.keys.cron_pending_lease(), {batch: now.timestamp() + CRON_CLAIM_LEASE_S})
        window_key = self.keys.cron_window
        pair_keys = self._pair_keys
        calls: list[list[_Entry]] = []
        for (window, wid, deadline), group in by_window.items():
            # The window key must outlive every replica's chance to fire the window.
            win_ms = int(((deadline - now).total_seconds() + 120) * 1000)
            header: list[Any] = [
                int(window.timestamp()),
                wid,
                now.timestamp(),
                owner,
                "1" if manual else "0",
                max(1000, win_ms),
                skipped_window_owner(owner),
            ]
            for start in range(0, len(group), CHUNK):
                chunk = group[start : start + CHUNK]
                call_keys: list[str] = []
                args = list(header)
                for _, task, tenant, spec in chunk:
                    call_keys.append(window_key(task.id, tenant, wid))
                    call_keys.extend(pair_keys(task, tenant))
                    args.append(spec)
                run_script(pipe, "cron_claim", call_keys, args)
                calls.append(chunk)
        # Replicated before anything is published: a window key lost in a failover fires again.
        queued = queue_wait(pipe, self.client)
        results = took_wait(pipe.execute(), queued, self.client, "cron window keys")
        if requests:
            results = results[2:]
        codes = [CronClaimCode.TAKEN] * len(requests)
        for chunk, result in zip(calls, results, strict=True):
            if isinstance(result, bytes):  # a client that does not decode responses
                result = result.decode()
            for entry, code in zip(chunk, result, strict=True):
                if entry[0] < len(codes):  # not a mark
                    codes[entry[0]] = _CODES[code]
        if requests and CronClaimCode.FIRE not in codes:
            self._forget_claims(self.client.pipeline(transaction=False), batch).execute()
        return Claim(codes, batch)

    def _forget_claims(self, pipe: Any, *batches: str) -> Any:
        """Queue dropping claim records and their leases on ``pipe``; return it."""
        pipe.hdel(self.keys.cron_pending(), *batches)
        pipe.zrem(self.keys.cron_pending_lease(), *batches)
        return pipe

    def confirm_sent(self, claim: Claim) -> None:
        """The messages are on the broker: the claim is no longer pending."""
        self._forget_claims(self.client.pipeline(transaction=False), claim.batch).execute()

    def expired_claims(self, now: datetime, limit: int = 50) -> list[str]:
        """Claim ids whose lease ended unconfirmed (one ZRANGEBYSCORE: cheap every tick)."""
        key = self.keys.cron_pending_lease()
        ids = self.client.zrangebyscore(key, "-inf", now.timestamp(), start=0, num=limit)
        return cast("list[str]", ids)  # decode_responses=True and no scores

    def take_over(self, batch: str, now: datetime) -> PendingClaim | None:
        """Win the expired claim ``batch`` for this caller (one beat of all wins), or None.

        The winner holds a fresh lease: if it dies too, the next beat takes the claim over."""
        raw = run_script(
            self.client,
            "cron_takeover",
            [self.keys.cron_pending(), self.keys.cron_pending_lease()],
            [batch, now.timestamp(), now.timestamp() + CRON_CLAIM_LEASE_S],
        )
        if not raw:
            return None
        record = json.loads(raw)
        return PendingClaim(
            batch=batch,
            owner=str(record[CronPendingField.OWNER]),
            at=float(record[CronPendingField.AT]),
            members=tuple(record[CronPendingField.MEMBERS]),
            manual=bool(record.get(CronPendingField.MANUAL, False)),
        )

    def confirm_taken_over(self, claim: PendingClaim, published: Sequence[FireRequest]) -> None:
        """A takeover published ``published``: count them and drop the claim."""
        pipe = self._forget_claims(self.client.pipeline(transaction=False), claim.batch)
        for req in published:
            pipe.hincrby(self.keys.cron_stats(req.task.id), CronStatsField.TAKEN_OVER, 1)
        pipe.execute()

    def record_never_published(
        self, claim: PendingClaim, members: Sequence[str], now: datetime, why: str
    ) -> None:
        """Members of a taken-over claim that can no longer be sent become gap records."""
        pipe = self.client.pipeline(transaction=False)
        detector = f"claimed by {claim.owner}, never published ({why})"
        for member in members:
            task_id, tenant, wid = split_member(member)
            start = parse_window_id(wid)
            pipe.lpush(
                self.keys.cron_gaps(),
                gap_record(task_id, start, start + WINDOW, now, detector, tenant=tenant),
            )
        pipe.ltrim(self.keys.cron_gaps(), 0, GAPS_KEPT - 1)
        pipe.execute()

    def record_send_failure(
        self,
        requests: Sequence[FireRequest],
        error: str,
        now: datetime,
        claim: Claim | PendingClaim,
    ) -> None:
        """Publishing failed after the window keys were taken: the window is not retried
        (that could fire twice), it is recorded so list and diagnose show it.

        Besides the failing state (which the next successful run clears), each window becomes a
        gap record, so diagnose still names the windows a broker outage cost after it is over.
        """
        if not requests:
            return
        pipe = self.client.pipeline(transaction=False)
        stamp = now.timestamp()
        for req in requests:
            gap = gap_record(
                req.task.id,
                req.window,
                req.window + req.task.window_length,
                now,
                error,
                tenant=req.tenant,
            )
            pipe.lpush(self.keys.cron_gaps(), gap)
            state = self.keys.cron_state(req.task.id, req.tenant)
            pipe.hset(
                state,
                mapping={
                    CronStateField.OUTCOME: CronOutcome.SEND_FAILED,
                    CronStateField.LAST_ERROR: error,
                    CronStateField.LAST_ERROR_AT: stamp,
                    CronStateField.LAST_END: stamp,
                },
            )
            pipe.hincrby(state, CronStateField.FAILED, 1)
            pipe.hincrby(self.keys.cron_stats(req.task.id), CronStatsField.FAILED, 1)
            pipe.hset(self.keys.cron_failing(), f"{req.task.id}|{req.tenant}", error)
            if req.task.singleton:
                pipe.delete(self.keys.cron_inflight(req.task.id, req.tenant))
        pipe.ltrim(self.keys.cron_gaps(), 0, GAPS_KEPT - 1)
        self._forget_claims(pipe, claim.batch)
        pipe.execute()

    def note_first_seen(self, tasks: Iterable[CronTask], window: datetime) -> None:
        """Remember the first window any beat knew a task in, so a task that never fired can
        still be reported overdue."""
        pipe = self.client.pipeline(transaction=False)
        for task in tasks:
            pipe.hsetnx(
                self.keys.cron_stats(task.id), CronStatsField.FIRST_SEEN, int(window.timestamp())
            )
        pipe.execute()

    def record_gaps(
        self,
        gaps: Sequence[Gap | tuple[CronTask, datetime, datetime]],
        now: datetime,
        detector: str,
    ) -> int:
        """Record ranges of windows nobody fired (one record per task, or per tenant); return
        how many tasks got a new record (``cron_gaps.lua`` skips what was recorded before)."""
        if not gaps:
            return 0
        ranges = [gap if isinstance(gap, Gap) else Gap(*gap) for gap in gaps]
        keys = [self.keys.cron_gaps()] + [self.keys.cron_stats(gap.task.id) for gap in ranges]
        args: list[Any] = [now.timestamp(), detector, GAPS_KEPT]
        for gap in ranges:
            args.extend(
                [
                    gap.task.id,
                    int(gap.start.timestamp()),
                    int(gap.end.timestamp()),
                    gap.count,
                    gap.period,
                    json.dumps(list(gap.tenants)),
                    gap.note,
                    int(gap.if_seen),
                ]
            )
        return int(run_script(self.client, "cron_gaps", keys, args))

    def gaps(self, limit: int = GAPS_KEPT) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.keys.cron_gaps(), 0, limit - 1)]

    def heartbeat(self, beat_id: str, now: datetime) -> None:
        self.client.hset(self.keys.beat_heartbeat(), beat_id, now.timestamp())

    def prune_heartbeats(self, older_than: datetime) -> int:
        """Forget beats gone for long (each start has a new id, so the hash would only grow)."""
        stale = [b for b, ts in self.heartbeats().items() if ts < older_than.timestamp()]
        gone = [b for b, ts in self.stopped_beats().items() if ts < older_than.timestamp()]
        if gone:
            self.client.hdel(self.keys.cron_beats_stopped(), *gone)
        return self.client.hdel(self.keys.beat_heartbeat(), *stale) if stale else 0

    def beat_stopped(self, beat_id: str, now: datetime) -> None:
        """A clean stop: the beat's heartbeat goes, the time it stopped stays for diagnose."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.keys.beat_heartbeat(), beat_id)
        pipe.hset(self.keys.cron_beats_stopped(), beat_id, now.timestamp())
        pipe.execute()

    def stopped_beats(self) -> dict[str, float]:
        reply = self.client.hgetall(self.keys.cron_beats_stopped())
        raw = cast("dict[str, str]", reply)  # decode_responses=True
        return {beat: float(ts) for beat, ts in raw.items()}

    # --- worker ---------------------------------------------------------------------------
    def run_started(
        self,
        task_id: str,
        tenant: str,
        window: str,
        manual: bool,
        now: datetime,
        celery_id: str = "",
        *,
        hard_time_limit: float = 0.0,
        not_before: datetime | None = None,
    ) -> str | Early | None:
        """Mark the window started (its run key, SET NX) and record the run; return None when
        this delivery may run, else the Celery id of the delivery that started the window first
        (this one is then counted as ``suppressed`` and must not run).

        With ``not_before`` (the window's start), a delivery that arrives before it on Redis's
        clock writes nothing and gets :class:`Early` instead (beat fired it within its lead).

        The run key lives until the window's deadline plus the hard limit plus a minute: no
        delivery of the window can start later than the deadline (its message expires)."""
        deadline = window_deadline(parse_window_id(window), self.grace)
        ttl_ms = int(((deadline - now).total_seconds() + hard_time_limit + 60) * 1000)
        # Replicated before the body runs: a lost run key lets a second delivery run it again.
        answer = run_replicated(
            self.client,
            "cron_start",
            [
                self.keys.cron_run(task_id, tenant, window),
                self.keys.cron_state(task_id, tenant),
                self.keys.cron_stats(task_id),
            ],
            [
                max(60_000, ttl_ms),
                celery_id or "?",
                window,
                now.timestamp(),
                "1" if manual else "0",
                0 if not_before is None else math.ceil(not_before.timestamp() * 1000),
            ],
            "a cron run key",
        )
        if isinstance(answer, int) and answer < 0:
            return Early(-answer / 1000.0)
        if isinstance(answer, bytes):
            answer = answer.decode()
        return None if answer == 1 else str(answer)

    def run_finished(
        self,
        task_id: str,
        tenant: str,
        window: str,
        outcome: CronOutcome,
        error: str,
        now: datetime,
    ) -> None:
        """Record the end of a run and release the in-flight key if it is still this run's."""
        run_script(
            self.client,
            "cron_finish",
            [
                self.keys.cron_inflight(task_id, tenant),
                self.keys.cron_state(task_id, tenant),
                self.keys.cron_stats(task_id),
                self.keys.cron_failing(),
            ],
            [window, CronOutcome(outcome), now.timestamp(), error, f"{task_id}|{tenant}", tenant],
        )

    # --- readers --------------------------------------------------------------------------
    def stats(self, task_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hgetall(self.keys.cron_stats(task_id))
        return dict(zip(task_ids, pipe.execute(), strict=True))

    def states(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for task_id, tenant in pairs:
            pipe.hgetall(self.keys.cron_state(task_id, tenant))
        return dict(zip(pairs, pipe.execute(), strict=True))

    def inflight_windows(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The window id each (task, tenant) holds its in-flight key for (a singleton run that
        was fired and has not finished), for those that hold one."""
        pipe = self.client.pipeline(transaction=False)
        for task_id, tenant in pairs:
            pipe.get(self.keys.cron_inflight(task_id, tenant))
        return {p: wid for p, wid in zip(pairs, pipe.execute(), strict=True) if wid}

    def window_owner(self, task_id: str, tenant: str, wid: str) -> str | None:
        owner = self.client.get(self.keys.cron_window(task_id, tenant, wid))
        return cast("str | None", owner)  # decode_responses=True

    def _pending(self) -> dict[str, dict[str, Any]]:
        reply = self.client.hgetall(self.keys.cron_pending())
        raw = cast("dict[str, str]", reply)  # decode_responses=True
        return {batch: json.loads(record) for batch, record in raw.items()}

    def lost_claims(self, cutoff: datetime) -> list[str]:
        """Members (``task|tenant|window``) claimed before ``cutoff`` and never confirmed
        published: the claim fired them (their state's ``last_sent_at`` is the claim's time)
        and no run of that window ever started."""
        stale: list[tuple[float, str]] = []
        for record in self._pending().values():
            at = float(record[CronPendingField.AT])
            if at < cutoff.timestamp():
                stale.extend((at, member) for member in record[CronPendingField.MEMBERS])
        if not stale:
            return []
        pairs = [split_member(member)[:2] for _, member in stale]
        pipe = self.client.pipeline(transaction=False)
        for task_id, tenant in pairs:
            pipe.hmget(self.keys.cron_state(task_id, tenant), *_SENT_AND_RUN)
        lost = []
        for (at, member), (sent_at, run_window) in zip(stale, pipe.execute(), strict=True):
            if sent_at and float(sent_at) == at and run_window != split_member(member)[2]:
                lost.append(member)
        return lost

    def sweep_lost_claims(self, cutoff: datetime, now: datetime) -> list[str]:
        """Turn claims unconfirmed since before ``cutoff`` into gap records (kept for diagnose
        like any gap) and drop them from the pending index; return the lost members."""
        records = self._pending()
        stale = [
            b for b, rec in records.items() if float(rec[CronPendingField.AT]) < cutoff.timestamp()
        ]
        if not stale:
            return []
        lost = self.lost_claims(cutoff)
        owners = {}
        for batch in stale:
            record = records[batch]
            owners.update(
                dict.fromkeys(record[CronPendingField.MEMBERS], record[CronPendingField.OWNER])
            )
        pipe = self.client.pipeline(transaction=False)
        for member in lost:
            task_id, tenant, wid = split_member(member)
            start = parse_window_id(wid)
            detector = f"claimed by {owners.get(member, '?')}, never published"
            pipe.lpush(
                self.keys.cron_gaps(),
                gap_record(task_id, start, start + WINDOW, now, detector, tenant=tenant),
            )
        pipe.ltrim(self.keys.cron_gaps(), 0, GAPS_KEPT - 1)
        self._forget_claims(pipe, *stale)
        pipe.execute()
        return lost

    def prune_pending(self, older_than: datetime) -> int:
        """Drop unconfirmed claims older than ``older_than`` (diagnose has reported them)."""
        old = [
            batch
            for batch, record in self._pending().items()
            if float(record[CronPendingField.AT]) < older_than.timestamp()
        ]
        if not old:
            return 0
        return self._forget_claims(self.client.pipeline(transaction=False), *old).execute()[0]

    def failing(self) -> dict[str, str]:
        reply = self.client.hgetall(self.keys.cron_failing())
        return cast("dict[str, str]", reply)  # decode_responses=True

    def heartbeats(self) -> dict[str, float]:
        reply = self.client.hgetall(self.keys.beat_heartbeat())
        raw = cast("dict[str, str]", reply)  # decode_responses=True
        return {beat: float(ts) for beat, ts in raw.items()}
