"""Quarantine: a job whose own data makes a dispatch step fail is set aside, not retried.

Why: one corrupt or out-of-range job (a field written by hand, a restore that tore a hash, a
bug) must not stop a tick for everyone. Each step (promote, claim, publish, reap, the worker's
post-exec write) isolates the jobs it handles: when one job's read, arithmetic or Lua call
fails, that job is logged and quarantined here and the step goes on with the others.

A quarantined job is in no index and holds no lease (``quarantine.lua``); its hash is kept for
inspection, with its record in ``JobField.QUARANTINE`` (a ``QuarantineField`` JSON: step,
reason, time) and its id in the ``Keys.quarantine`` set, which ``checks diagnose`` lists.

Release decision: a job is rebuilt from its check's definition, with fresh run state (EWMAs and
counters reset), by an update or an enable of the check (``CheckStore``) and by
``checks reconcile``; a job whose definition cannot be decoded either stays quarantined. A
deleted check's jobs leave the quarantine with it. A rebuilt job that fails again is
quarantined again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import redis

from celery_app.checks.jobs import DECODE_ERRORS
from celery_app.findings import Finding, FindingKind
from celery_app.redis.schema import (
    JobField,
    Keys,
    QuarantineField,
    QuarantineStep,
    by_partition,
    split_job_id,
)
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW

log = logging.getLogger(__name__)

#: What a job's own data can make a step raise (a bad number, an overflow, a Lua error); a lost
#: connection or a timeout is no job's fault and is never a reason to quarantine.
DATA_ERRORS: tuple[type[BaseException], ...] = (*DECODE_ERRORS, redis.ResponseError)

#: Redis error codes that say the server cannot run the call now (memory, a replica, loading,
#: a busy script, auth): no job's fault, never a reason to quarantine.
SERVER_STATE_CODES = (
    "OOM", "READONLY", "LOADING", "BUSY", "NOSCRIPT", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
    "MISCONF", "NOREPLICAS", "NOPERM", "NOAUTH", "MOVED", "ASK",
)  # fmt: skip
_SERVER_STATE = re.compile(r"(?:^|: |: -)(?:" + "|".join(SERVER_STATE_CODES) + r")\b")


def is_job_error(exc: BaseException) -> bool:
    """Whether ``exc`` can be the fault of the job's data (see :data:`DATA_ERRORS`)."""
    if not isinstance(exc, DATA_ERRORS):
        return False
    return not (isinstance(exc, redis.ResponseError) and _SERVER_STATE.search(str(exc)))


def failing_alone(errors: Sequence[BaseException | None]) -> bool:
    """Whether the failures of a batch retried item by item (None: that item succeeded) may be
    blamed on their items: every one is a job error. If the server refused any (memory, a
    replica, ...), the step raises and nobody is quarantined.

    Even when every item fails it is theirs to carry: raising would stop the tick for everyone
    again. The cost: a broken script would quarantine the jobs it touched (each listed by
    ``checks diagnose`` with the error; ``checks reconcile`` rebuilds them once it is fixed)."""
    return all(is_job_error(e) for e in errors if e is not None)


#: Longest reason kept (an error message can be long; the record stays small).
MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class QuarantinedJob:
    """One quarantine record, as ``checks diagnose`` shows it."""

    job_id: str
    step: str
    reason: str
    at: float

    def finding(self) -> Finding:
        """The record as ``checks diagnose`` reports it, with how it is released."""
        since = datetime.fromtimestamp(self.at, UTC) if self.at else None
        shown = since.isoformat(timespec="milliseconds") if since else None
        message = (
            f"job {self.job_id} quarantined by {self.step} at {shown}: {self.reason} "
            "(released by `checks update`/`enable` of its check or by `checks reconcile`)"
        )
        return Finding(FindingKind.QUARANTINED, self.job_id, message, since)


def describe(exc: BaseException) -> str:
    """An error as one short line: its class and message."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text[:MAX_REASON_CHARS]


def _keys_of(keys: Keys, job_id: str, tenants: Iterable[str]) -> list[str] | None:
    try:
        _uid, region = split_job_id(job_id)
    except ValueError:
        return None
    lanes = (LANE_FAST, LANE_SLOW)
    held = [keys.held(region, lane, t) for t in sorted(set(tenants)) if t for lane in lanes]
    return [
        keys.job(job_id),
        keys.quarantine(),
        keys.due(),
        *(keys.ready(region, lane) for lane in lanes),
        *(keys.leases(region, lane) for lane in lanes),
        *held,
    ]


def quarantine(
    client: redis.Redis,
    keys: Keys,
    job_id: str,
    step: QuarantineStep,
    error: BaseException | str,
    now_s: float,
) -> bool:
    """Set ``job_id`` aside (see the module docstring); never raises for a bad job id: a due
    entry that is no job id at all is only dropped from the due index."""
    reason = error if isinstance(error, str) else describe(error)
    log.error("checkbeat: job %s quarantined at %s: %s", job_id, step, reason)
    try:
        reply = client.hget(keys.job(job_id), JobField.TENANT)
        tenant = cast("str | None", reply) or ""  # decode_responses=True
    except redis.ResponseError:  # the key is not a hash at all
        tenant = ""
    script_keys = _keys_of(keys.of_job(job_id), job_id, [tenant])
    if script_keys is None:
        client.zrem(keys.due(), job_id)  # the due index it was found in: the caller's
        return False
    record: dict[str, str | float] = {
        QuarantineField.STEP: str(step),
        QuarantineField.REASON: reason,
    }
    record[QuarantineField.AT] = round(now_s, 3)
    payload = json.dumps(record, separators=(",", ":"))
    return bool(run_script(client, "quarantine", keys=script_keys, args=[job_id, payload]))


def read_quarantine(client: redis.Redis, keys: Keys) -> list[QuarantinedJob]:
    """Every quarantined job of every partition, oldest first."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        pipe.smembers(part.quarantine())
    ids = sorted(set().union(*pipe.execute()))  # decode_responses=True
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), JobField.QUARANTINE)
    out = []
    for job_id, raw in zip(ids, pipe.execute(raise_on_error=False), strict=True):
        try:
            rec = json.loads(raw)
            out.append(
                QuarantinedJob(
                    job_id,
                    str(rec.get(QuarantineField.STEP, "")),
                    str(rec.get(QuarantineField.REASON, "")),
                    float(rec.get(QuarantineField.AT, 0.0)),
                )
            )
        except (ValueError, TypeError, AttributeError):
            out.append(QuarantinedJob(job_id, "", f"unreadable record {str(raw)[:80]!r}", 0.0))
    return sorted(out, key=lambda q: (q.at, q.job_id))


def quarantined_of(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[str]:
    """Those of ``job_ids`` that are quarantined."""
    if not job_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.sismember(keys.of_job(job_id).quarantine(), job_id)
    return [j for j, flag in zip(job_ids, pipe.execute(), strict=True) if flag]


def release(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[str]:
    """Drop the hashes and set entries of those of ``job_ids`` that are quarantined, so the
    caller's write (an update, an enable, a reconcile) places them as new jobs; the released.
    A job outside the quarantine is untouched."""
    released = quarantined_of(client, keys, job_ids)
    for group in by_partition(keys, released, lambda job_id: job_id.rpartition("@")[0]):
        part = keys.of_job(group[0])
        pipe = client.pipeline(transaction=True)
        for job_id in group:
            pipe.delete(part.job(job_id))
        pipe.srem(part.quarantine(), *group)
        pipe.execute()
    if released:
        log.warning("checkbeat: released %d quarantined job(s): %s", len(released), released)
    return released
