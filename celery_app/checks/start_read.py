"""A check run's start read: one round trip just before the probe, two plain commands.

Why: the run needs its job (is the lease still its own? the post-exec write plans from it),
its check's kind, target and config (what to probe: only those, not the whole definition),
and must mark its lease started so a second delivery of the same message is dropped. The job's
``HGETALL`` and the started marker's ``SET NX`` go pipelined, not in a script: a script costs
Redis its call and the job hash copied into Lua and out again, on every run, and buys nothing
here. The marker is keyed by the lease token, which no other lease of any job ever has, so the
marker a stale or forged message sets (its lease not the job's, or no such job) is one no run
of a current lease ever reads; the read deletes it again, so a bad message leaves nothing
behind, and the message is dropped (the worker compares the lease first).

Why the check's fields are not read every time: they change only when the check is edited,
and every such write puts their digest in the check's jobs (``JobField.PROBE_DIGEST``), which
the run reads anyway; the process keeps the fields it read (:class:`KeptFields`), reads them
with the job while it keeps none, and again in a round trip of their own only when the job's
digest is not the one kept (the check was edited since).

Why the maintenance version is read at most once a second per process: it changes when an
operator edits a window, rarely, so the worker plans with the version its window cache last
saw (:meth:`~celery_app.checks.maintenance.WindowCache.known_version`), and a start read asks
for it again only when that reading is ``VERSION_REFRESH_S`` old. The windows decide two
things: whether a change of the check's state is held or delivered, and whether the run's
record is marked as run inside a window. The first is checked against the version as it is
when the write lands (``complete.lua``'s guard: a moved version sends the write back to read
the windows and plan again); the second goes by the version the plan was made with, as if the
run had landed before the edit, and is current again within the refresh.

Why Redis's time is not read here: the run starts on its tick on the server's clock, which the
process keeps (``redis.clock.SERVER_CLOCK``: one ``TIME`` reading advanced by its monotonic
clock, read again every ``CLOCK_REFRESH_S``) instead of a ``TIME`` in every start.

Why replicated before the probe: when the deployment waits for replicas
(``CHECKBEAT_REDIS_WAIT_REPLICAS``), the read is followed by ``WAIT`` on the same round trip.
Replication is ordered, so once a replica has the started marker it also has the claim that
made the lease: a master that dies after the probe began cannot take the claim with it, and
the promoted replica does not claim and run the same tick again. A shortfall is logged and
counted, and the run goes on (docs/high-availability.md, "A check run across a failover").
On a Redis Cluster the ``WAIT`` goes to the master that owns the job's slot, on the connection
the read went on (``celery_app/redis/replication.py``). The read's time is taken when the
reply arrives, after the ``WAIT``: a time from before it would be older by however long the
WAIT blocked (up to ``CHECKBEAT_REDIS_WAIT_TIMEOUT``), and a run that planned its next tick from
it would place the tick in the past and run again at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from celery_app.checks.definition import decode_config, probe_digest
from celery_app.checks.maintenance import WINDOWS
from celery_app.checks.redaction import stored_check_secrets
from celery_app.redis.clock import SERVER_CLOCK
from celery_app.redis.replication import may_wait, queue_wait, took_wait
from celery_app.redis.schema import CheckField, JobField, Keys


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """What a check says to probe, as a run reads it (``CheckField`` kind, target, config)."""

    kind: str
    target: str
    config: dict[str, Any]

    @classmethod
    def of(cls, kind: str | None, target: str | None, config: str | None) -> ProbeSpec:
        """The fields as the start read found them; a ValueError when the hash is torn."""
        if kind is None or target is None:
            raise ValueError("the check's hash has no kind or no target")
        return cls(kind, target, decode_config(config))


@dataclass(frozen=True, slots=True)
class StartRead:
    """What the start read found; the job hash is empty when absent."""

    job_hash: dict[str, str]
    check_fields: CheckFields
    server_now: float  # Redis's time (Unix s) when the read was answered
    first_delivery: bool  # this lease is current and no delivery of it started before
    # the version this process last read (within VERSION_REFRESH_S: see the module docstring)
    maintenance_version: str | None

    @property
    def check_exists(self) -> bool:
        return any(value is not None for value in self.check_fields)

    def probe(self) -> ProbeSpec:
        """What to probe (read only for a run that goes on: a stale one decodes nothing)."""
        return ProbeSpec.of(*self.check_fields)

    def secrets(self) -> tuple[str, ...]:
        """The check's secrets, what its run's result is scrubbed of
        (:func:`~celery_app.checks.redaction.stored_check_secrets`, cached per check)."""
        _kind, target, config = self.check_fields
        return stored_check_secrets(target or "", config or "")


CheckFields = tuple[str | None, str | None, str | None]  # kind, target, config

#: Most checks whose fields one process keeps before it starts over.
MAX_KEPT = 100_000


class KeptFields:
    """The kind, target and config of the checks this process ran, each kept with its digest
    (``definition.probe_digest``): the start read reads them again only when the job's
    digest (``JobField.PROBE_DIGEST``) is another, so a run of an unedited check reads its job
    and not its check. Only fields whose digest is the job's are kept: a job written without
    one (before the field existed) reads its check on every run."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[str, CheckFields]] = {}

    def get(self, check_key: str) -> tuple[str, CheckFields] | None:
        return self._kept.get(check_key)

    def keep(self, check_key: str, job_digest: str | None, fields: CheckFields) -> None:
        kind, target, config = fields
        if job_digest is None or kind is None or target is None or config is None:
            return
        if probe_digest(kind, target, config) != job_digest:
            return
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        self._kept[check_key] = (job_digest, fields)


#: The process's copy (runs start on many threads; a dict read or write is atomic).
KEPT = KeptFields()


def read_start(
    client: redis.Redis, keys: Keys, job_id: str, uid: str, lease_token: str, task_id: str,
    marker_ttl_ms: int,
) -> StartRead:  # fmt: skip
    """Read the run of ``job_id`` under ``lease_token`` before its probe, and mark it started
    (kept ``marker_ttl_ms``) unless a delivery of it started before; replicated (WAIT) before
    it answers when ``client`` asks for replicas."""
    check_key = keys.check(uid)
    kept = KEPT.get(check_key)  # this thread's snapshot: the copy compared is the copy used
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.job(job_id))
    pipe.set(keys.run_started(job_id, lease_token), task_id, nx=True, px=marker_ttl_ms)
    if kept is None:
        pipe.hmget(check_key, *_PROBED)
    version_due = WINDOWS.version_due(keys)
    if version_due:
        sent = time.monotonic()  # its age counts from here: the WAIT below may block
        pipe.get(keys.maintenance_version())
    queued = queue_wait(pipe, client) if may_wait(client) else []
    replies = took_wait(pipe.execute(), queued, client, "a check run's start")
    now = SERVER_CLOCK.now(client)
    if version_due:
        WINDOWS.version_read(keys, replies.pop(), sent)
    job_hash: dict[str, str] = replies[0]
    current = job_hash.get(JobField.LEASE_TOKEN) == lease_token
    if replies[1] and not current:  # this message's own marker, of no current lease: undone
        client.delete(keys.run_started(job_id, lease_token))
    first = bool(replies[1]) and current
    if kept is not None and (not job_hash or job_hash.get(JobField.PROBE_DIGEST) == kept[0]):
        # the job's digest is the kept copy's: it is current (no job: the run is rejected
        # before it probes, so its check need not be read)
        fields = kept[1]
    else:
        if kept is None:
            kind, target, config = replies[2]
        else:  # the check was edited since this process read it
            kind, target, config = client.hmget(check_key, *_PROBED)
        fields = (kind, target, config)
        KEPT.keep(check_key, job_hash.get(JobField.PROBE_DIGEST), fields)
    return StartRead(job_hash, fields, now, first, WINDOWS.known_version(keys))


#: The check's fields a run reads: what to probe.
_PROBED = (CheckField.KIND, CheckField.TARGET, CheckField.CONFIG)
