"""Cron state in Redis: the per-window claim, the in-flight key, run records and counters.

Why here and not in beat: the beat fires, the worker records the run (signals) and the CLI runs a
task now through the same lock, and those three never import each other. Every write of a batch
is one round trip (a pipeline of Lua calls over chunks), never one per task.

Layout (see :class:`celery_app.redis.schema.Keys`): ``cron_window`` (SET NX PX, one per task,
tenant, window), ``cron_inflight`` (TTL bounds a run that never reports back), ``cron_state``
(hash per task and tenant), ``cron_stats`` (hash per task), ``cron_pending`` (claimed, publish
not yet confirmed) and ``cron_failing`` (pairs whose last run failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any
from uuid import uuid4

import redis

from celery_app.cron_tasks.registration import GLOBAL_TENANT, WINDOW, CronTask, window_id
from celery_app.redis.schema import Keys

CHUNK = 500  # entries per Lua call; one pipeline carries all chunks

FIRE, TAKEN, IN_FLIGHT, MARKED = 1, 0, 2, 3

# The keys of each entry are built here from the pieces of Keys' templates (see
# _key_pieces), so a window of 10,000 entries ships 3 short arguments per entry, not 8.
# ARGV[1..7] = window ts, window id, now, owner, manual, window key
# ttl ms, then the pieces of the window, in-flight, state and stats key templates (as one
# string separated by \n); then 3 per entry: task id, tenant, kind and in-flight ttl ms
# (kind S singleton, N non-singleton, M mark the task's window only; e.g. "S:305000").
_CLAIM_LUA = """
local wts, wid, now, owner, manual, winttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local p = {}
for piece in string.gmatch(ARGV[7] .. '\\n', '([^\\n]*)\\n') do p[#p+1] = piece end
local out = {}
local n = (#ARGV - 7) / 3
for i = 0, n - 1 do
  local task, tenant, spec = ARGV[8+3*i], ARGV[9+3*i], ARGV[10+3*i]
  local kind = string.sub(spec, 1, 1)
  local stats = p[11] .. task .. p[12]
  local code = 1
  if kind == 'M' then
    code = 3
  else
    local state = p[8] .. task .. p[9] .. tenant .. p[10]
    if kind == 'S' then
      local win = p[1] .. task .. p[2] .. tenant .. p[3] .. wid .. p[4]
      if redis.call('SET', win, owner, 'NX', 'PX', winttl) then
        local infl = p[5] .. task .. p[6] .. tenant .. p[7]
        if not redis.call('SET', infl, wid, 'NX', 'PX', string.sub(spec, 3)) then
          code = 2
          redis.call('SET', win, 'skipped:' .. owner, 'PX', winttl)
        end
      else
        code = 0
      end
    end
    if code == 1 then
      redis.call('HSET', state, 'last_window', wts, 'last_sent_at', now, 'manual', manual)
      redis.call('HINCRBY', state, 'fired', 1)
      redis.call('HINCRBY', stats, 'fired', 1)
    elseif code == 2 then
      redis.call('HSET', state, 'last_window', wts, 'last_skip_window', wts,
                 'last_skip_reason', 'in-flight')
      redis.call('HINCRBY', state, 'skipped', 1)
      redis.call('HINCRBY', stats, 'skipped', 1)
    end
  end
  -- Windows of one task are claimed in order, so this only moves forward.
  if code ~= 0 then redis.call('HSET', stats, 'last_window', wts) end
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
  local gap_to = tonumber(redis.call('HGET', KEYS[i], 'last_gap_to') or '0')
  -- a window some beat handled is no gap; a gap already recorded is not recorded twice
  if last < tonumber(from) and gap_to < tonumber(to) then
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
class Claim:
    """The outcome of one claim round trip: a code per request, and its pending record."""

    codes: list[int]
    batch: str

    def __getitem__(self, index: int) -> int:
        return self.codes[index]

    def __len__(self) -> int:
        return len(self.codes)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.codes)


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


def _key_pieces(keys: Keys) -> list[str]:
    """Split Keys' cron templates around their variable parts, for the claim script.

    Rendering each template with markers keeps Keys the single definition of the layout.
    """
    t, n, w = "\x01", "\x02", "\x03"
    pieces: list[str] = []
    for rendered, markers in (
        (keys.cron_window(t, n, w), (t, n, w)),
        (keys.cron_inflight(t, n), (t, n)),
        (keys.cron_state(t, n), (t, n)),
        (keys.cron_stats(t), (t,)),
    ):
        rest = rendered
        for marker in markers:
            before, found, rest = rest.partition(marker)
            if not found:
                raise ValueError(f"key template {rendered!r} lacks its parts in the usual order")
            pieces.append(before)
        pieces.append(rest)
    return pieces


class CronStore:
    """Reads and writes cron state for one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys, grace: timedelta) -> None:
        self.client = client
        self.keys = keys
        self.grace = grace
        self._claim = client.register_script(_CLAIM_LUA)
        self._pieces = "\n".join(_key_pieces(keys))
        # The script builds its keys from the templates; KEYS names one of them for routing.
        self._lua_key = keys.cron_pending()
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
    ) -> Claim:
        """Take the window keys of ``requests`` (one round trip) and return a code for each.

        FIRE: this caller must send it (its in-flight key is set; the claim is listed as
        pending until :meth:`confirm_sent` or :meth:`record_send_failure`).
        TAKEN: another replica or a manual run already has this window. IN_FLIGHT: the previous
        run has not finished; the window is consumed and recorded as skipped. ``marks`` record
        that a task's window was handled even with no tenant to fire for.
        """
        entries: list[tuple[str, str, str, datetime]] = []
        left_ms: dict[datetime, float] = {}  # per window: ms until its grace ends
        for req in requests:
            kind = "S" if req.task.singleton else "N"
            window = req.window
            base = left_ms.get(window)
            if base is None:
                base = (window_deadline(window, self.grace) - now).total_seconds() * 1000
                left_ms[window] = base
            # A message may wait until the deadline, then run up to the hard limit.
            inflight_ms = max(1000, int(base + req.task.hard_time_limit * 1000))
            entries.append((req.task.id, req.tenant, f"{kind}:{inflight_ms}", window))
        for task, window in marks:
            entries.append((task.id, GLOBAL_TENANT, "M:0", window))
        by_window: dict[datetime, list[int]] = {}
        for index, entry in enumerate(entries):
            by_window.setdefault(entry[3], []).append(index)
        pipe = self.client.pipeline(transaction=False)
        batch = f"{owner}|{now.timestamp():.6f}|{uuid4().hex[:8]}"
        if requests:
            # Written before the keys are taken, in the same round trip: if this process dies
            # before publishing, diagnose finds the claim here instead of a silent loss.
            record = {
                "owner": owner,
                "at": now.timestamp(),
                "members": [req.member for req in requests],
            }
            pipe.hset(self.keys.cron_pending(), batch, json.dumps(record))
        calls: list[list[int]] = []
        for window, indexes in by_window.items():
            # The window key must outlive every replica's chance to fire the window.
            win_ms = int(((window_deadline(window, self.grace) - now).total_seconds() + 120) * 1000)
            header: list[Any] = [
                int(window.timestamp()),
                window_id(window),
                now.timestamp(),
                owner,
                "1" if manual else "0",
                max(1000, win_ms),
                self._pieces,
            ]
            for start in range(0, len(indexes), CHUNK):
                chunk = indexes[start : start + CHUNK]
                args = list(header)
                for index in chunk:
                    args.extend(entries[index][:3])
                self._claim(keys=[self._lua_key], args=args, client=pipe)
                calls.append(chunk)
        results = pipe.execute()
        if requests:
            results = results[1:]
        codes = [TAKEN] * len(entries)
        for chunk, result in zip(calls, results, strict=True):
            for index, code in zip(chunk, result, strict=True):
                codes[index] = int(code)
        codes = codes[: len(requests)]
        if requests and FIRE not in codes:
            self.client.hdel(self.keys.cron_pending(), batch)
        return Claim(codes, batch)

    def confirm_sent(self, claim: Claim) -> None:
        """The messages are on the broker: the claim is no longer pending."""
        self.client.hdel(self.keys.cron_pending(), claim.batch)

    def record_send_failure(
        self, requests: Sequence[FireRequest], error: str, now: datetime, claim: Claim
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
            gap = {
                "task": req.task.id,
                "tenant": req.tenant,
                "from": req.window.timestamp(),
                "to": (req.window + WINDOW).timestamp(),
                "detected_at": stamp,
                "detector": error,
            }
            pipe.lpush(self.keys.cron_gaps(), json.dumps(gap))
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
        pipe.ltrim(self.keys.cron_gaps(), 0, 999)
        pipe.hdel(self.keys.cron_pending(), claim.batch)
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

    def prune_heartbeats(self, older_than: datetime) -> int:
        """Forget beats gone for long (each start has a new id, so the hash would only grow)."""
        stale = [b for b, ts in self.heartbeats().items() if ts < older_than.timestamp()]
        return self.client.hdel(self.keys.beat_heartbeat(), *stale) if stale else 0

    # --- worker ---------------------------------------------------------------------------
    def run_started(
        self,
        task_id: str,
        tenant: str,
        window: str,
        manual: bool,
        now: datetime,
        celery_id: str = "",
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(
            self.keys.cron_state(task_id, tenant),
            mapping={
                "outcome": "running",
                "last_start": now.timestamp(),
                "last_run_window": window,
                "manual": "1" if manual else "0",
                "celery_id": celery_id or "",
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

    def lost_claims(self, cutoff: datetime) -> list[str]:
        """Members (``task|tenant|window``) claimed before ``cutoff`` and never confirmed
        published: the claim fired them (their state's ``last_sent_at`` is the claim's time)
        and no run of that window ever started."""
        stale = []
        for raw in self.client.hvals(self.keys.cron_pending()):
            record = json.loads(raw)
            if float(record["at"]) < cutoff.timestamp():
                stale.extend((float(record["at"]), member) for member in record["members"])
        if not stale:
            return []
        pairs = [split_member(member)[:2] for _, member in stale]
        pipe = self.client.pipeline(transaction=False)
        for task_id, tenant in pairs:
            pipe.hmget(self.keys.cron_state(task_id, tenant), "last_sent_at", "last_run_window")
        lost = []
        for (at, member), (sent_at, run_window) in zip(stale, pipe.execute(), strict=True):
            if sent_at and float(sent_at) == at and run_window != split_member(member)[2]:
                lost.append(member)
        return lost

    def sweep_lost_claims(self, cutoff: datetime, now: datetime) -> list[str]:
        """Turn claims unconfirmed since before ``cutoff`` into gap records (kept for diagnose
        like any gap) and drop them from the pending index; return the lost members."""
        records = self.client.hgetall(self.keys.cron_pending())
        stale = [
            b for b, raw in records.items() if float(json.loads(raw)["at"]) < cutoff.timestamp()
        ]
        if not stale:
            return []
        lost = self.lost_claims(cutoff)
        owners = {}
        for batch in stale:
            record = json.loads(records[batch])
            owners.update(dict.fromkeys(record["members"], record["owner"]))
        pipe = self.client.pipeline(transaction=False)
        for member in lost:
            task_id, tenant, wid = split_member(member)
            start = datetime.strptime(wid, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC)
            gap = {
                "task": task_id,
                "tenant": tenant,
                "from": start.timestamp(),
                "to": (start + WINDOW).timestamp(),
                "detected_at": now.timestamp(),
                "detector": f"claimed by {owners.get(member, '?')}, never published",
            }
            pipe.lpush(self.keys.cron_gaps(), json.dumps(gap))
        pipe.ltrim(self.keys.cron_gaps(), 0, 999)
        pipe.hdel(self.keys.cron_pending(), *stale)
        pipe.execute()
        return lost

    def prune_pending(self, older_than: datetime) -> int:
        """Drop unconfirmed claims older than ``older_than`` (diagnose has reported them)."""
        old = [
            batch
            for batch, raw in self.client.hgetall(self.keys.cron_pending()).items()
            if float(json.loads(raw)["at"]) < older_than.timestamp()
        ]
        return self.client.hdel(self.keys.cron_pending(), *old) if old else 0

    def failing(self) -> dict[str, str]:
        return self.client.hgetall(self.keys.cron_failing())

    def heartbeats(self) -> dict[str, float]:
        raw = self.client.hgetall(self.keys.beat_heartbeat())
        return {beat: float(ts) for beat, ts in raw.items()}
