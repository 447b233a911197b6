"""Cron state in Redis: the per-window claim, the in-flight key, run records and counters.

Why here and not in beat: the beat fires, the worker records the run (signals) and the CLI runs a
task now through the same lock, and those three never import each other. Every write of a batch
is one round trip (a pipeline of Lua calls over chunks), never one per task.

Layout (see :class:`celery_app.keys.Keys`): ``cron_window`` (SET NX PX, one per task, tenant,
window), ``cron_inflight`` (TTL bounds a run that never reports back), ``cron_state`` (hash per
task and tenant), ``cron_stats`` (hash per task), ``cron_pending`` (claimed, publish not yet
confirmed) and ``cron_failing`` (pairs whose last run failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

import redis

from celery_app.cron import WINDOW, CronTask, window_id
from celery_app.keys import Keys

CHUNK = 500  # entries per Lua call; one pipeline carries all chunks

FIRE, TAKEN, IN_FLIGHT, MARKED = 1, 0, 2, 3

# KEYS[1] = pending zset; then 4 keys per entry: window, in-flight, state, stats.
# ARGV[1..5] = window ts, window id, now, owner, manual; then 4 per entry:
#   kind (S singleton, N non-singleton, M mark the task's window only), window key ttl ms,
#   in-flight ttl ms, pending member.
_CLAIM_LUA = """
local wts, wid, now, owner, manual = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pending = KEYS[1]
local out = {}
local n = (#KEYS - 1) / 4
for i = 0, n - 1 do
  local win, infl, state, stats = KEYS[2+4*i], KEYS[3+4*i], KEYS[4+4*i], KEYS[5+4*i]
  local kind, winttl, inflttl, member = ARGV[6+4*i], ARGV[7+4*i], ARGV[8+4*i], ARGV[9+4*i]
  local code = 1
  if kind == 'M' then
    code = 3
  elseif kind == 'S' then
    if redis.call('SET', win, owner, 'NX', 'PX', winttl) then
      if redis.call('EXISTS', infl) == 1 then
        code = 2
      else
        redis.call('SET', infl, wid, 'PX', inflttl)
      end
    else
      code = 0
    end
  end
  if code ~= 0 then
    local cur = tonumber(redis.call('HGET', stats, 'last_window') or '0')
    if tonumber(wts) > cur then redis.call('HSET', stats, 'last_window', wts) end
  end
  if code == 1 then
    redis.call('HSET', state, 'last_window', wts, 'last_sent_at', now, 'manual', manual)
    redis.call('HINCRBY', state, 'fired', 1)
    redis.call('HINCRBY', stats, 'fired', 1)
    redis.call('ZADD', pending, now, member)
  elseif code == 2 then
    redis.call('HSET', state, 'last_window', wts, 'last_skip_window', wts,
               'last_skip_reason', 'in-flight')
    redis.call('HINCRBY', state, 'skipped', 1)
    redis.call('HINCRBY', stats, 'skipped', 1)
  end
  out[i+1] = code
end
return out
"""

# KEYS: in-flight, state, stats, failing. ARGV: window id, outcome, now, error, member, tenant.
_FINISH_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[2], 'last_end', ARGV[3], 'outcome', ARGV[2])
redis.call('HSET', KEYS[3], 'last_end', ARGV[3], 'last_outcome', ARGV[2], 'last_tenant', ARGV[6])
if ARGV[2] == 'success' then
  redis.call('HDEL', KEYS[4], ARGV[5])
else
  redis.call('HSET', KEYS[2], 'last_error', ARGV[4], 'last_error_at', ARGV[3])
  redis.call('HSET', KEYS[3], 'last_error', ARGV[4], 'last_error_at', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 'failed', 1)
  redis.call('HINCRBY', KEYS[3], 'failed', 1)
  redis.call('HSET', KEYS[4], ARGV[5], ARGV[4])
end
return 1
"""

# KEYS: gaps list; then one stats key per gap. ARGV: now, detector; then task, from, to per gap.
# A gap is recorded only if nobody handled a window since: another replica may have fired it.
_GAPS_LUA = """
local recorded = 0
for i = 2, #KEYS do
  local task, from, to = ARGV[3*i-3], ARGV[3*i-2], ARGV[3*i-1]
  local last = tonumber(redis.call('HGET', KEYS[i], 'last_window') or '0')
  if last < tonumber(from) then
    redis.call('LPUSH', KEYS[1], cjson.encode({task=task, from=tonumber(from), to=tonumber(to),
                                               detected_at=tonumber(ARGV[1]), detector=ARGV[2]}))
    redis.call('HSET', KEYS[i], 'last_gap_from', from, 'last_gap_to', to)
    recorded = recorded + 1
  end
end
redis.call('LTRIM', KEYS[1], 0, 999)
return recorded
"""


@dataclass(frozen=True)
class FireRequest:
    """One (task, tenant, window) to fire; ``tenant`` is GLOBAL_TENANT for global tasks."""

    task: CronTask
    tenant: str
    window: datetime  # window start, UTC

    @cached_property
    def window_id(self) -> str:
        return window_id(self.window)

    @cached_property
    def member(self) -> str:
        return f"{self.task.id}|{self.tenant}|{self.window_id}"


def split_member(member: str) -> tuple[str, str, str]:
    task_id, tenant, wid = member.split("|")
    return task_id, tenant, wid


def window_deadline(window: datetime, grace: timedelta) -> datetime:
    """When a window's grace ends: nothing of it may be sent, or start, after this."""
    return window + WINDOW + grace


class CronStore:
    """Reads and writes cron state for one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys, grace: timedelta) -> None:
        self.client = client
        self.keys = keys
        self.grace = grace
        self._claim = client.register_script(_CLAIM_LUA)
        self._finish = client.register_script(_FINISH_LUA)
        self._gaps = client.register_script(_GAPS_LUA)

    # --- beat / run-now -------------------------------------------------------------------
    def claim(
        self,
        requests: Sequence[FireRequest],
        *,
        now: datetime,
        owner: str,
        manual: bool = False,
        marks: Iterable[tuple[CronTask, datetime]] = (),
    ) -> list[int]:
        """Take the window keys of ``requests`` (one round trip) and return a code for each.

        FIRE: this caller must send it (its in-flight key is set, it is listed as pending).
        TAKEN: another replica or a manual run already has this window. IN_FLIGHT: the previous
        run has not finished; the window is consumed and recorded as skipped. ``marks`` record
        that a task's window was handled even with no tenant to fire for.
        """
        entries: list[tuple[list[str], list[Any], datetime]] = []
        for req in requests:
            entries.append(self._entry(req, now))
        for task, window in marks:
            stats = self.keys.cron_stats(task.id)
            entries.append(([stats] * 4, ["M", 1, 1, ""], window))
        by_window: dict[datetime, list[int]] = {}
        for index, (_, _, window) in enumerate(entries):
            by_window.setdefault(window, []).append(index)
        pipe = self.client.pipeline(transaction=False)
        calls: list[list[int]] = []
        for window, indexes in by_window.items():
            for start in range(0, len(indexes), CHUNK):
                chunk = indexes[start : start + CHUNK]
                keys = [self.keys.cron_pending()]
                args: list[Any] = [
                    int(window.timestamp()),
                    window_id(window),
                    now.timestamp(),
                    owner,
                    "1" if manual else "0",
                ]
                for index in chunk:
                    keys.extend(entries[index][0])
                    args.extend(entries[index][1])
                self._claim(keys=keys, args=args, client=pipe)
                calls.append(chunk)
        codes = [TAKEN] * len(entries)
        for chunk, result in zip(calls, pipe.execute(), strict=True):
            for index, code in zip(chunk, result, strict=True):
                codes[index] = int(code)
        return codes[: len(requests)]

    def _entry(self, req: FireRequest, now: datetime) -> tuple[list[str], list[Any], datetime]:
        task, tenant = req.task, req.tenant
        deadline = window_deadline(req.window, self.grace)
        # The window key must outlive every replica's chance to fire the window.
        win_ttl = max(1000, int(((deadline - now).total_seconds() + 120) * 1000))
        # A message may wait until the deadline, then run up to the hard limit.
        inflight_ttl = max(
            1000, int(((deadline - now).total_seconds() + task.hard_time_limit) * 1000)
        )
        keys = [
            self.keys.cron_window(task.id, tenant, req.window_id),
            self.keys.cron_inflight(task.id, tenant),
            self.keys.cron_state(task.id, tenant),
            self.keys.cron_stats(task.id),
        ]
        kind = "S" if task.singleton else "N"
        return keys, [kind, win_ttl, inflight_ttl, req.member], req.window

    def confirm_sent(self, requests: Sequence[FireRequest]) -> None:
        """The messages are on the broker: drop them from the pending index."""
        if not requests:
            return
        pipe = self.client.pipeline(transaction=False)
        members = [req.member for req in requests]
        for start in range(0, len(members), 5000):
            pipe.zrem(self.keys.cron_pending(), *members[start : start + 5000])
        pipe.execute()

    def record_send_failure(
        self, requests: Sequence[FireRequest], error: str, now: datetime
    ) -> None:
        """Publishing failed after the window keys were taken: the window is not retried
        (that could fire twice), it is recorded so list and diagnose show it."""
        if not requests:
            return
        pipe = self.client.pipeline(transaction=False)
        stamp = now.timestamp()
        for req in requests:
            state = self.keys.cron_state(req.task.id, req.tenant)
            pipe.hset(
                state,
                mapping={
                    "outcome": "send-failed",
                    "last_error": error,
                    "last_error_at": stamp,
                    "last_end": stamp,
                },
            )
            pipe.hincrby(state, "failed", 1)
            pipe.hincrby(self.keys.cron_stats(req.task.id), "failed", 1)
            pipe.hset(self.keys.cron_failing(), f"{req.task.id}|{req.tenant}", error)
            if req.task.singleton:
                pipe.delete(self.keys.cron_inflight(req.task.id, req.tenant))
        pipe.zrem(self.keys.cron_pending(), *[req.member for req in requests])
        pipe.execute()

    def note_first_seen(self, tasks: Iterable[CronTask], window: datetime) -> None:
        """Remember the first window any beat knew a task in, so a task that never fired can
        still be reported overdue."""
        pipe = self.client.pipeline(transaction=False)
        for task in tasks:
            pipe.hsetnx(self.keys.cron_stats(task.id), "first_seen", int(window.timestamp()))
        pipe.execute()

    def record_gaps(
        self, gaps: Sequence[tuple[CronTask, datetime, datetime]], now: datetime, detector: str
    ) -> int:
        """Record windows ``[from, to)`` of tasks that nobody fired; return how many were new."""
        if not gaps:
            return 0
        keys = [self.keys.cron_gaps()] + [self.keys.cron_stats(task.id) for task, _, _ in gaps]
        args: list[Any] = [now.timestamp(), detector]
        for task, start, end in gaps:
            args.extend([task.id, int(start.timestamp()), int(end.timestamp())])
        return int(self._gaps(keys=keys, args=args))

    def gaps(self, limit: int = 1000) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.keys.cron_gaps(), 0, limit - 1)]

    def heartbeat(self, beat_id: str, now: datetime) -> None:
        self.client.hset(self.keys.beat_heartbeat(), beat_id, now.timestamp())

    # --- worker ---------------------------------------------------------------------------
    def run_started(
        self, task_id: str, tenant: str, window: str, manual: bool, now: datetime
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(
            self.keys.cron_state(task_id, tenant),
            mapping={
                "outcome": "running",
                "last_start": now.timestamp(),
                "last_run_window": window,
                "manual": "1" if manual else "0",
            },
        )
        pipe.hset(self.keys.cron_stats(task_id), "last_start", now.timestamp())
        pipe.execute()

    def run_finished(
        self, task_id: str, tenant: str, window: str, outcome: str, error: str, now: datetime
    ) -> None:
        """Record the end of a run and release the in-flight key if it is still this run's."""
        self._finish(
            keys=[
                self.keys.cron_inflight(task_id, tenant),
                self.keys.cron_state(task_id, tenant),
                self.keys.cron_stats(task_id),
                self.keys.cron_failing(),
            ],
            args=[window, outcome, now.timestamp(), error, f"{task_id}|{tenant}", tenant],
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

    def window_owner(self, task_id: str, tenant: str, wid: str) -> str | None:
        return self.client.get(self.keys.cron_window(task_id, tenant, wid))

    def pending_before(self, cutoff: datetime) -> list[str]:
        return self.client.zrangebyscore(self.keys.cron_pending(), "-inf", cutoff.timestamp())

    def failing(self) -> dict[str, str]:
        return self.client.hgetall(self.keys.cron_failing())

    def heartbeats(self) -> dict[str, float]:
        raw = self.client.hgetall(self.keys.beat_heartbeat())
        return {beat: float(ts) for beat, ts in raw.items()}
