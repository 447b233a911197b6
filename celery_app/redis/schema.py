"""Every Redis key and every hash field name checkbeat writes, in one place.

Why one module: beat writes what the workers read and the CLI reports, and they never import each
other, so the names are the contract. Lua scripts get their keys in KEYS (built here, never in
Lua) and their field names from the tables below, which :mod:`celery_app.redis.scripts` renders
as a Lua preamble (``JOB.SCHEDULED_AT`` in a script is ``JobField.SCHEDULED_AT`` here). Times
stored in Redis are Unix seconds as floats (ZSET scores and hash fields alike); a job is
``<check uid>@<region>``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum, unique
from functools import lru_cache
from typing import TypeVar

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from scheduling_core.health import State

T = TypeVar("T")
LANE_NAMES = ("fast", "slow")  # index = scheduling_core LANE_FAST / LANE_SLOW
#: Redis Cluster hash tags of the two halves of the keyspace (``Keys(prefix, cluster=True)``).
CHECKS_TAG = "{checks}"
CRON_TAG = "{cron}"


@unique
class CheckField(StrEnum):
    """Fields of a check definition hash (``Keys.check``), all written by ``store.lua`` from
    ``definition.encode_check``; read by the worker (kind, target, config) and the CLI."""

    TENANT = "t"
    KIND = "k"
    TARGET = "tg"
    CONFIG = "cf"  # JSON object
    PERIOD = "p"  # whole seconds
    REGIONS = "g"  # comma list
    REGION_SPREAD = "s"  # seconds; absent = the default spread
    PLAN_WEIGHT = "w"
    ENABLED = "e"  # "1" / "0"
    VERSION = "v"  # bumped by every write (optimistic concurrency)
    FAILURE_THRESHOLD = "ft"  # consecutive failures to go down; "" = the settings default
    SUCCESS_THRESHOLD = "st"  # consecutive successes to recover; "" = the settings default
    QUORUM = "q"  # regions down for the check to be down; "" = a majority


@unique
class JobField(StrEnum):
    """Fields of a (check, region) job hash (``Keys.job``); short names keep it a listpack.

    The authoritative list (``celery_app.checks.jobs`` has an overview table). "store" is
    ``store.lua`` (reconcile, repair), "complete" is ``complete.lua`` (worker or reaper),
    "claim" is ``claim.lua``, "release" is ``release.lua``, "abandon" is ``abandon.lua``.
    """

    TENANT = "t"  # store
    PLAN_WEIGHT = "w"  # store
    PERIOD = "p"  # whole seconds; store
    REGIONS = "g"  # the check's regions, comma list (phase = index in the sorted list); store
    REGION_SPREAD = "s"  # seconds; absent = the default spread; store
    SCHEDULED_AT = "sa"  # Unix s; store, complete, abandon, claim (a held job's missed ticks)
    EFFECTIVE_AT = "ea"  # Unix s: the WFQ order key; store, complete, abandon
    COST_EWMA_MS = "c"  # absent = 0; complete
    DELAY_EWMA_MS = "d"  # absent = 0; complete
    LANE = "l"  # 0 fast / 1 slow, absent = 0; complete
    RUNS = "n"  # runs completed (or reaped); complete
    SKIPPED = "sk"  # runs skipped by the tenant rate limit; claim (when a held job is released)
    ABANDONED = "ab"  # ticks lost to a run that raised before its probe; abandon
    PASSED = "ps"  # ticks passed over: due while a run was late or still running; complete
    HEARTBEAT = "hb"  # "1": a heartbeat check's job (pinged, never probed); promote.lua diverts it
    HEARTBEAT_STARTED = "hbs"  # Unix s of the last start ping of a heartbeat check's job
    # The lease, set by a claim; '' or absent when none (a completion empties both in the HSET
    # of its run, release, abandon and quarantine delete them: lua/include/lease.lua)
    LEASE_TOKEN = "lt"
    LEASE_EXPIRY = "lx"  # Unix s
    DISABLED = "off"  # "1" while the check is disabled (the job is in no index); store
    QUARANTINE = "q"  # JSON QuarantineField record while quarantined (in no index); quarantine
    FAILURE_THRESHOLD = "ft"  # copied from the check ("" = default); store
    SUCCESS_THRESHOLD = "st"  # copied from the check ("" = default); store
    QUORUM = "qm"  # copied from the check ("" = majority); store
    PROBE_DIGEST = "pd"  # digest of the check's kind, target and config (definition.probe_digest)
    HEALTH = "hs"  # the region's state, a health.State (absent = up); complete
    STREAK_STATE = "hk"  # the state the current run of identical results points to; complete
    STREAK = "hn"  # how many results in a row point to STREAK_STATE; complete
    # "<quorum>|<regions, comma list>" this region's run last counted the check's state by; a
    # run whose region's state did not move counts again only when it differs (an edit of the
    # quorum or regions); complete
    COUNTED = "cb"
    # "1" while a window holds the check's change back (CheckStateField.HELD_UNTIL): the
    # region's runs count the state again; complete, transition_release
    HOLD = "hd"


@unique
class WorkerField(StrEnum):
    """Fields of a check worker's registration hash (``Keys.worker``), written by the worker's
    heartbeat (``workers.roles``); the claim script counts ROLE and CONCURRENCY minus STUCK."""

    HOSTNAME = "hostname"
    REGION = "region"
    ROLE = "role"  # a WorkerRoleName
    QUEUES = "queues"  # comma list
    CONCURRENCY = "concurrency"
    PID = "pid"
    HEARTBEAT = "heartbeat"  # Unix s
    STUCK = "stuck"  # slots held by probe threads still running past their deadline (absent 0)


@unique
class WorkerRoleName(StrEnum):
    """Values of ``WorkerField.ROLE``: a fast worker's slots are reserved for fast work, a
    shared worker's slots take both lanes (slow work only ever counts these)."""

    FAST = "fast"
    SHARED = "shared"


@unique
class BucketField(StrEnum):
    """Fields of a tenant's token bucket (``Keys.rate_limit``): RATE and BURST written by
    ``checks.ratelimit``, TOKENS and UPDATED by the claim script as it spends tokens. With
    several partitions each holds one bucket of the tenant: RATE and BURST are its share, and
    SET_RATE and SET_BURST what the operator set for the whole tenant."""

    RATE = "rate"  # runs per minute
    BURST = "burst"
    TOKENS = "tokens"
    UPDATED = "ts"  # Unix s of the last refill
    SET_RATE = "srate"
    SET_BURST = "sburst"


@unique
class QuarantineField(StrEnum):
    """Fields of a quarantine record (the JSON of ``JobField.QUARANTINE``), written by
    ``checks.quarantine`` when a job's data made a dispatch step fail."""

    STEP = "step"  # a QuarantineStep value
    REASON = "reason"  # the error, one line
    AT = "at"  # Unix s (Redis time)


@unique
class QuarantineStep(StrEnum):
    """The dispatch step whose failure set a job aside (``QuarantineField.STEP``)."""

    PROMOTE = "promote"
    CLAIM = "claim"
    PUBLISH = "publish"
    REAP = "reap"
    RUN = "run"  # the worker could not read the job it was sent
    POST_EXEC = "post-exec"
    RECONCILE = "reconcile"


@unique
class ResultField(StrEnum):
    """Fields of one entry of a check's results stream (``Keys.results``), written by
    ``complete.lua``; ``Keys.last_result`` maps region -> the same record JSON."""

    REGION = "region"
    RECORD = "result"  # the JSON of a ``checks.run_contract.RunRecord``


#: The field tables Lua scripts see, by the name they have there (see redis.scripts).
LUA_FIELD_TABLES: dict[str, type[StrEnum] | type[IntEnum]] = {
    "CHECK": CheckField,
    "JOB": JobField,
    "WORKER": WorkerField,
    "BUCKET": BucketField,
    "ROLE": WorkerRoleName,
    "RESULT": ResultField,
    "QUARANTINE": QuarantineField,
}


def job_id(uid: str, region: str) -> str:
    """The id of one (check, region) job."""
    return f"{uid}@{region}"


def split_job_id(job: str) -> tuple[str, str]:
    """Inverse of :func:`job_id` (uids may not contain ``@``; regions never do)."""
    uid, _, region = job.rpartition("@")
    if not uid or not region:
        raise ValueError(f"job id {job!r} is not of the form <uid>@<region>")
    return uid, region


def check_queue(region: str, lane: int | str) -> str:
    """The Celery queue a lane of a region is published to: ``checks.<region>.<lane>``."""
    name = LANE_NAMES[lane] if isinstance(lane, int) else lane
    return f"checks.{region}.{name}"


def partition_of(uid: str, partitions: int) -> int:
    """The partition of the check half a check lives in: a stable hash of its uid (CRC32, the
    same in every process and every version), so its jobs in every region, its state and its
    transitions share one partition and every script of a run touches one slot."""
    return zlib.crc32(uid.encode()) % partitions if partitions > 1 else 0


def by_partition(keys: Keys, items: Iterable[T], uid_of: Callable[[T], str]) -> list[list[T]]:
    """``items`` grouped by the partition of the check half their check lives in (in order
    within a group): one script call or transaction writes one partition (one cluster slot)."""
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(keys.of_check(uid_of(item)).partition, []).append(item)
    return [groups[p] for p in sorted(groups)]


@lru_cache(maxsize=16)
def partition_tags(partitions: int) -> tuple[str, ...]:
    """The hash tag of each partition of the check half: ``{checks}`` when there is one, else
    ``{checks.<p>.<salt>}`` with the smallest salt whose cluster slot falls in the p-th of
    ``partitions`` equal ranges of the 16,384 slots. Why the salt: a cluster's masters own
    contiguous slot ranges, so tags spread evenly over the slots spread the partitions evenly
    over the masters (``checks.<p>`` alone lands where CRC16 puts it: two partitions of three
    can share a master)."""
    if partitions <= 1:
        return (CHECKS_TAG,)
    tags = []
    for p in range(partitions):
        low, high = p * SLOTS // partitions, (p + 1) * SLOTS // partitions
        salt = 0
        while not low <= key_slot(f"checks.{p}.{salt}".encode()) < high:
            salt += 1
        tags.append(f"{{checks.{p}.{salt}}}")
    return tuple(tags)


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix (``CHECKBEAT_KEY_PREFIX``).

    With ``cluster=True`` (the state store is a Redis Cluster, :func:`celery_app.redis.keyspace.
    state_keys`) every key carries one of two hash tags after the prefix: the check half
    (``<prefix>:{checks}:...``) and the cron half (``<prefix>:{cron}:...``), so every script
    touches one slot (a completion writes a job, the due index, the check's state and every
    region's job at once; a cron claim takes up to 500 tasks' windows and the pending record).
    Without it the names are those of a plain or Sentinel Redis, unchanged
    (docs/high-availability.md, "Redis Cluster").

    With ``partitions`` > 1 (``CHECKBEAT_CHECK_PARTITIONS``) the check half is cut in that many
    partitions, each under its own hash tag (:func:`partition_tags`), on any Redis. A key of
    one check or job (``check``, ``job``, ``check_state``, ...) is in the check's partition
    whatever ``partition`` says; every other key of the check half (the due, ready and lease
    indexes, workers, token buckets, the transition outbox, ...) is the one of ``partition``:
    :meth:`at`, :meth:`of_check` and :meth:`of_job` give the ``Keys`` of a partition.
    """

    prefix: str
    cluster: bool = False
    partitions: int = 1
    partition: int = 0

    def at(self, partition: int) -> Keys:
        """These keys, in ``partition`` of the check half."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.partitions - 1}")
        return self if partition == self.partition else replace(self, partition=partition)

    def of_check(self, uid: str) -> Keys:
        """The keys of the partition check ``uid`` lives in."""
        return self.at(partition_of(uid, self.partitions))

    def of_job(self, job: str) -> Keys:
        """The keys of the partition job ``job`` (``<uid>@<region>``) lives in."""
        return self.of_check(job.rpartition("@")[0])

    def of_transition(self, transition_id: str) -> Keys:
        """The keys of the partition transition ``<uid>#<seq>`` was made in."""
        return self.of_check(transition_id.rpartition("#")[0])

    def every_partition(self) -> list[Keys]:
        """The keys of each partition of the check half, in order."""
        return [self.at(p) for p in range(self.partitions)]

    def _head(self, partition: int) -> str:
        if self.partitions > 1:
            return f"{self.prefix}:{partition_tags(self.partitions)[partition]}"
        return f"{self.prefix}:{CHECKS_TAG}" if self.cluster else self.prefix

    @property
    def _checks(self) -> str:
        """The head of every key of this partition of the check half (indexes, workers, ...)."""
        return self._head(self.partition)

    def _checks_of(self, uid: str) -> str:
        """The head of every key of check ``uid`` (its definition, jobs, state, results)."""
        return self._head(partition_of(uid, self.partitions))

    def _checks_of_job(self, job: str) -> str:
        return self._checks_of(job.rpartition("@")[0])

    @property
    def _cron(self) -> str:
        """The head of every key of the cron half (windows, runs, records, tenants, beats)."""
        return f"{self.prefix}:{CRON_TAG}" if self.cluster else self.prefix

    # --- cron tasks ----------------------------------------------------------------------
    def cron_window(self, task_id: str, tenant: str, window: str) -> str:
        """Taken with SET NX PX by the one replica that fires this (task, tenant, window)."""
        return f"{self._cron}:cron:win:{task_id}:{tenant}:{window}"

    def cron_inflight(self, task_id: str, tenant: str) -> str:
        """Set at send, deleted by the worker at the end of the run; TTL = the task timeout."""
        return f"{self._cron}:cron:inflight:{task_id}:{tenant}"

    def cron_state(self, task_id: str, tenant: str) -> str:
        """Hash: last window, last run start/end, outcome, error, counters."""
        return f"{self._cron}:cron:state:{task_id}:{tenant}"

    def cron_stats(self, task_id: str) -> str:
        """Hash per task (all tenants): last window handled, first window seen, counters."""
        return f"{self._cron}:cron:stats:{task_id}"

    def cron_ref(self, task_id: str, fingerprint: str) -> str:
        """Unix s, the reference instant of a task's schedule, keyed by the schedule's
        fingerprint (a changed schedule has no reference yet): the first instant any beat saw
        it (``SET NX``: every beat reads the same value). An interval's windows are
        ``ref + k * every``; a crontab or cron spec fires first at its first window after it.
        For a schedule without a fixed grid (``CronTask.is_custom``) it is the last run all
        beats share: the claim that fires it moves it forward (``cron_claim.lua``)."""
        return f"{self._cron}:cron:ref:{task_id}:{fingerprint}"

    def cron_pending(self) -> str:
        """Hash claim id -> JSON {owner, at, members}: claims not yet confirmed published.

        Written in the claim's own round trip; a beat killed between taking window keys and
        publishing leaves its record here, so the loss is reported instead of silent.
        """
        return f"{self._cron}:cron:pending"

    def cron_pending_lease(self) -> str:
        """ZSET claim id -> Unix s its lease ends (``CRON_CLAIM_LEASE_S`` after the claim): a
        claim still listed when its lease ends is taken over by one beat and published."""
        return f"{self._cron}:cron:pending:lease"

    def cron_run(self, task_id: str, tenant: str, window: str) -> str:
        """Taken with SET NX by the first delivery of a window that starts running; a second
        delivery (takeover after a slow publish, redelivery) finds it and is suppressed."""
        return f"{self._cron}:cron:run:{task_id}:{tenant}:{window}"

    def cron_failing(self) -> str:
        """Hash ``task|tenant`` -> last error: the pairs whose last run failed (diagnose index)."""
        return f"{self._cron}:cron:failing"

    def cron_gaps(self) -> str:
        """List (newest first, capped) of JSON gap records: windows nobody fired."""
        return f"{self._cron}:cron:gaps"

    def cron_runtime(self, task_id: str) -> str:
        """Hash of one runtime schedule (``schedule add``): :class:`RuntimeField` fields."""
        return f"{self._cron}:cron:runtime:{task_id}"

    def cron_runtime_ids(self) -> str:
        """Set of the ids of every runtime schedule."""
        return f"{self._cron}:cron:runtime-ids"

    def cron_runtime_version(self) -> str:
        """Counter INCRed by every runtime change: a beat reloads when it moves (one GET/tick)."""
        return f"{self._cron}:cron:runtime-version"

    def cron_paused(self) -> str:
        """Set of the ids of tasks declared in code (``@cron``, ``beat_schedule``) that
        ``schedule pause`` paused: no beat fires them until ``schedule resume``. A change INCRs
        ``cron_runtime_version``, so every beat reloads its task list at its next tick."""
        return f"{self._cron}:cron:paused"

    def cron_monitor_mark(self, task_id: str, tenant: str, window: str, phase: str) -> str:
        """Taken with SET NX PX by the one beat that turns a run's start or end into a ping of
        the task's heartbeat check (``beat/cron_monitor.py``), so two beats ping once."""
        return f"{self._cron}:cron:monitored:{task_id}:{tenant}:{window}:{phase}"

    def cron_monitor_tenants(self, task_id: str) -> str:
        """Set of the tenants of a per-tenant task whose heartbeat check is enabled
        (``beat/cron_monitor.py``): a tenant that leaves the provider's list is found here and
        its check paused, whichever beat saw it leave."""
        return f"{self._cron}:cron:monitor-tenants:{task_id}"

    def cron_recorders(self) -> str:
        """Hash worker hostname -> Unix s it last said it records cron runs (a worker that runs
        ``celery_app.cron_tasks.recording``): whether a run that no one recorded was lost or
        ran on a worker that does not record."""
        return f"{self._cron}:cron:recorders"

    def cron_beats_stopped(self) -> str:
        """Hash beat id -> Unix s of its clean stop (its heartbeat is dropped then), so
        diagnose can say when the last beat stopped instead of "never seen"."""
        return f"{self._cron}:cron:beats-stopped"

    def tenants(self) -> str:
        """Set of active tenants: the default tenants provider."""
        return f"{self._cron}:tenants"

    def beat_heartbeat(self) -> str:
        """Hash beat id -> last heartbeat (Unix s); diagnose reads it."""
        return f"{self._cron}:beat:heartbeats"

    # --- checks ----------------------------------------------------------------------------
    def check(self, uid: str) -> str:
        """Hash: the check definition."""
        return f"{self._checks_of(uid)}:check:{uid}"

    def check_layout(self) -> str:
        """String: the partition count the check half was built with (``checks/layout.py``),
        under the head of a one-partition check half whatever the count, so every count
        finds it."""
        return f"{self.prefix}:{CHECKS_TAG}:layout" if self.cluster else f"{self.prefix}:layout"

    def check_definitions(self) -> str:
        """The SCAN pattern of every check definition hash of this partition (``check`` of
        each uid stored here): what a repair reads when the ``checks`` set may be lost."""
        return f"{self._checks}:check:*"

    def checks(self) -> str:
        """Set of every check uid (of this partition)."""
        return f"{self._checks}:checks"

    def tenant_checks(self, tenant: str) -> str:
        """Set of the uids of one tenant's checks."""
        return f"{self._checks}:tenant:{tenant}:checks"

    def job(self, job: str) -> str:
        """Hash: one (check, region) job's scheduling state."""
        return f"{self._checks_of_job(job)}:job:{job}"

    def check_jobs(self, uid: str) -> str:
        """Set of the job ids of one check."""
        return f"{self._checks_of(uid)}:check:{uid}:jobs"

    def due(self) -> str:
        """ZSET job -> scheduled_at: jobs waiting for their tick."""
        return f"{self._checks}:due"

    def heartbeats_late(self) -> str:
        """ZSET job id -> deadline: heartbeat checks' jobs whose ping is late, moved here from
        the due index by ``promote.lua``; beat's dispatcher records each miss
        (``checks/heartbeat.py``) and places the job at its next deadline."""
        return f"{self._checks}:heartbeats-late"

    def dispatch_wake(self) -> str:
        """Pub/sub channel (not a key): the check store wrote a job's tick; beats sleeping past
        it wake and dispatch (``beat.dispatch_wake``)."""
        return f"{self._checks}:dispatch-wake"

    def ready(self, region: str, lane: int) -> str:
        """ZSET job -> effective_scheduled_at: due jobs of a (region, lane), in WFQ order."""
        return f"{self._checks}:ready:{region}:{LANE_NAMES[lane]}"

    def leases(self, region: str, lane: int) -> str:
        """ZSET job -> lease expiry: claimed jobs in flight in a (region, lane)."""
        return f"{self._checks}:leases:{region}:{LANE_NAMES[lane]}"

    def held(self, region: str, lane: int, tenant: str) -> str:
        """ZSET job -> effective_scheduled_at: due jobs of a (region, lane) that the tenant's
        token bucket turned away; released into the ready index as tokens come back."""
        return f"{self._checks}:held:{region}:{LANE_NAMES[lane]}:{tenant}"

    def held_tenants(self, region: str) -> str:
        """Set of tenants with held jobs in a region."""
        return f"{self._checks}:heldtenants:{region}"

    def quarantine(self) -> str:
        """Set of the job ids set aside because their data made a dispatch step fail (the
        record is the job's ``JobField.QUARANTINE``); in no index until released (an update or
        enable of the check, or ``checks reconcile``, rebuilds them from the definition)."""
        return f"{self._checks}:quarantine"

    def run_started(self, job: str, lease_token: str) -> str:
        """Marker (``SET NX`` with a TTL past the run's deadline) that a run of this lease has
        started: a second delivery of the same message (a publish retried after its reply was
        lost, a duplicated queue entry) is dropped instead of probing the target twice."""
        return f"{self._checks_of_job(job)}:started:{job}:{lease_token}"

    def results(self, uid: str) -> str:
        """Stream (capped): the check's recent results, all regions."""
        return f"{self._checks_of(uid)}:results:{uid}"

    def last_result(self, uid: str) -> str:
        """Hash region -> JSON of the last result in that region."""
        return f"{self._checks_of(uid)}:last:{uid}"

    def rate_limit(self, tenant: str) -> str:
        """Hash: a tenant's token bucket (rate per minute, burst, tokens, updated)."""
        return f"{self._checks}:ratelimit:{tenant}"

    def rate_limited_tenants(self) -> str:
        """Set of the tenants that have a token bucket: written with the bucket in one
        transaction, so a claim can declare every bucket it may spend without reading the
        tenant of each candidate first."""
        return f"{self._checks}:ratelimited"

    def claim_tenants_version(self) -> str:
        """Counter: moves whenever a tenant set a claim reads changes (any region's held
        tenants, in ``claim.lua``; the rate-limited tenants, in ``checks/ratelimit.py``, in the
        write's own transaction). A claimer keeps those sets between claims and reads them again
        only when this moved (``checks/claiming.py``, ``RegionClaimer``)."""
        return f"{self._checks}:claimtenantsversion"

    # --- workers ----------------------------------------------------------------------------
    def worker(self, hostname: str) -> str:
        """Hash with a TTL: region, role, queues, concurrency; refreshed by a heartbeat."""
        return f"{self._checks}:worker:{hostname}"

    def region_workers(self, region: str) -> str:
        """Set of worker hostnames registered for a region (stale ones have no worker key)."""
        return f"{self._checks}:workers:{region}"

    # --- metrics ----------------------------------------------------------------------------
    def metrics_endpoints(self) -> str:
        """Hash process name -> JSON {url, role, at}: where each beat and worker serves
        ``/metrics`` (refreshed while it runs; ``checkbeat status --json`` lists them)."""
        return f"{self._checks}:metrics:endpoints"

    # --- check state, transitions, maintenance ---------------------------------------------
    def check_state(self, uid: str) -> str:
        """Hash: the check's overall state (:class:`CheckStateField`); written by complete.lua
        and transition_release.lua, deleted with the check."""
        return f"{self._checks_of(uid)}:state:{uid}"

    def check_transitions(self, uid: str) -> str:
        """Stream (capped): the check's transitions, JSON (:class:`TransitionField`)."""
        return f"{self._checks_of(uid)}:transitions:{uid}"

    def tenant_transitions(self, tenant: str) -> str:
        """Stream (capped): every transition of the tenant's checks."""
        return f"{self._checks}:tenant:{tenant}:transitions"

    def transition_outbox(self) -> str:
        """ZSET transition id -> Unix s it may be (re)published: transitions not yet delivered.
        A publisher claims one by moving its score past now; the delivery removes it."""
        return f"{self._checks}:transitions:outbox"

    def transition_payloads(self) -> str:
        """Hash transition id -> its JSON, while it is in the outbox."""
        return f"{self._checks}:transitions:payloads"

    def transition_delivery(self, transition_id: str) -> str:
        """String with a TTL: the Celery task id delivering the transition now (SET NX PX)."""
        return f"{self.of_transition(transition_id)._checks}:transitions:delivering:{transition_id}"

    def transition_claims(self) -> str:
        """Hash transition id -> times it was claimed for publishing (each claim doubles the
        lease, so an unconsumed queue is not flooded with copies); cleared with the outbox entry."""
        return f"{self._checks}:transitions:claims"

    def transition_failed(self) -> str:
        """Hash transition id -> JSON {error, payload}: deliveries that exhausted their retries."""
        return f"{self._checks}:transitions:failed"

    def maintenance(self, scope: str) -> str:
        """In the first partition, whatever ``partition`` says (windows are read outside the
        run's scripts; each partition's ``maintenance_version`` says when they changed).
        Hash window id -> JSON window (cron, duration_s, timezone) of a scope:
        ``check:<uid>`` or ``tenant:<tenant>`` (:func:`maintenance_scope`)."""
        return f"{self._head(0)}:maintenance:{scope}"

    def maintenance_scopes(self) -> str:
        """Set of the scopes that have maintenance windows."""
        return f"{self._head(0)}:maintenance-scopes"

    def maintenance_version(self) -> str:
        """String: a random token replaced by every window change (with it, in one transaction),
        so workers cache the windows they read and read them again only when it moves; absent
        while no window was ever written."""
        return f"{self._checks}:maintenance-version"

    def maintenance_held(self) -> str:
        """ZSET uid -> Unix s its window ends: checks whose state changed inside a window and
        whose transition waits for the end (beat releases them)."""
        return f"{self._checks}:maintenance:held"

    # --- notification targets (celery_app/checks/notify.py) ----------------------------------
    def notify_targets(self, scope: str) -> str:
        """In the first partition, whatever ``partition`` says (a tenant's targets are not any
        one check's; the delivery reads them outside the transition scripts). Hash target id ->
        JSON target (``url``) of a scope: ``check:<uid>`` or ``tenant:<tenant>``
        (:func:`maintenance_scope`: the same scopes as maintenance windows)."""
        return f"{self._head(0)}:notify:{scope}"

    def notify_scopes(self) -> str:
        """Set of the scopes that have notification targets (first partition)."""
        return f"{self._head(0)}:notify-scopes"

    def notify_outcomes(self, transition_id: str) -> str:
        """Hash target id -> JSON :class:`NotifyOutcomeField` record: how the delivery of the
        transition to each target went (a retry sends only to targets not ``ok``), and
        :data:`HOOKS_DONE` once the ``@on_transition`` hooks returned. In the transition's
        partition; it expires ``NOTIFY_RECORD_TTL_S`` after its last write."""
        return f"{self.of_transition(transition_id)._checks}:notify:outcomes:{transition_id}"


# --- cron tasks ----------------------------------------------------------------------------
# Appended here (after Keys) so they stay apart from the check tables above; registered for
# Lua at the end of the module.


@unique
class CronStateField(StrEnum):
    """Fields of a (task, tenant) cron state hash (``Keys.cron_state``)."""

    LAST_WINDOW = "last_window"  # Unix s of the last window handled (fired or skipped)
    LAST_SENT_AT = "last_sent_at"  # Unix s of the claim that fired it (matches cron_pending)
    MANUAL = "manual"  # "1" when the last firing or run was a run-now
    FIRED = "fired"
    SKIPPED = "skipped"
    FAILED = "failed"
    LAST_SKIP_WINDOW = "last_skip_window"  # Unix s
    LAST_SKIP_REASON = "last_skip_reason"  # a CronSkipReason
    OUTCOME = "outcome"  # a CronOutcome
    LAST_START = "last_start"  # Unix s
    LAST_END = "last_end"  # Unix s
    LAST_RUN_WINDOW = "last_run_window"  # window id of the last run that started
    LAST_ERROR = "last_error"
    LAST_ERROR_AT = "last_error_at"  # Unix s
    CELERY_ID = "celery_id"  # Celery task id of the last run that started
    SUPPRESSED = "suppressed"  # deliveries of a window that already started (not run again)
    LAST_SUPPRESSED_AT = "last_suppressed_at"  # Unix s


@unique
class CronStatsField(StrEnum):
    """Fields of a task's cron stats hash, all tenants (``Keys.cron_stats``)."""

    LAST_WINDOW = "last_window"  # Unix s; windows of a task are claimed in order
    FIRST_SEEN = "first_seen"  # Unix s of the first window any beat knew the task in
    REF_FINGERPRINT = "ref_fingerprint"  # the schedule fingerprint of the last reference set
    FIRED = "fired"
    SKIPPED = "skipped"
    FAILED = "failed"
    LAST_START = "last_start"  # Unix s
    LAST_END = "last_end"  # Unix s
    LAST_OUTCOME = "last_outcome"  # a CronOutcome
    LAST_TENANT = "last_tenant"  # tenant of the last run that ended
    LAST_ERROR = "last_error"
    LAST_ERROR_AT = "last_error_at"  # Unix s
    LAST_GAP_FROM = "last_gap_from"  # Unix s: the last gap recorded for this task
    LAST_GAP_TO = "last_gap_to"
    SUPPRESSED = "suppressed"  # deliveries of a window that already started (not run again)
    TAKEN_OVER = "taken_over"  # windows a beat published for a claimer that never confirmed


@unique
class CronGapField(StrEnum):
    """Fields of a JSON gap record in ``Keys.cron_gaps`` (windows nobody fired)."""

    TASK = "task"
    TENANT = "tenant"  # absent when the gap is the task's (all tenants)
    FROM = "from"  # Unix s, first window not fired
    TO = "to"  # Unix s, end of the last window not fired
    COUNT = "count"  # how many windows of the task lie in [from, to) (absent: one)
    NOTE = "note"  # e.g. why the tenant is "*" (the provider could not be read)
    DETECTED_AT = "detected_at"  # Unix s
    DETECTOR = "detector"  # who found it and why


@unique
class CronPendingField(StrEnum):
    """Fields of a JSON claim record in ``Keys.cron_pending``."""

    OWNER = "owner"
    AT = "at"  # Unix s of the claim (= the fired pairs' last_sent_at)
    MEMBERS = "members"  # list of ``task|tenant|window``
    MANUAL = "manual"  # true for a run-now's claim (a takeover publishes it as one)


#: Seconds a claim may stay unconfirmed before another beat takes it over and publishes it.
CRON_CLAIM_LEASE_S = 10.0


@unique
class CronOutcome(StrEnum):
    """A cron run's outcome, as stored in ``CronStateField.OUTCOME`` / ``LAST_OUTCOME``."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILURE = "failure"
    EXPIRED = "expired"  # the message expired (window deadline) before a worker ran it
    REVOKED = "revoked"
    SEND_FAILED = "send-failed"  # claimed, but publishing failed


#: Outcomes that end a run (everything but RUNNING).
CRON_FINISHED = frozenset(CronOutcome) - {CronOutcome.RUNNING}


@unique
class CronSkipReason(StrEnum):
    """Why an engine did not send a (task, tenant, window); IN_FLIGHT is also stored
    (``CronStateField.LAST_SKIP_REASON``)."""

    TAKEN = "taken"  # another replica or a run-now has the window
    IN_FLIGHT = "in-flight"  # the previous run has not finished; recorded as skipped
    NO_PROVIDER = "no-provider"  # per-tenant task, no tenants provider configured
    PROVIDER_FAILED = "provider-failed"  # the tenants provider raised
    SEND_FAILED = "send-failed"  # publishing failed after the claim; recorded
    MISSED = "missed"  # the window's grace passed before a tick; recorded as a gap
    SUPERSEDED = "superseded"  # a later window of the task was due in the same tick


@unique
class CronClaimCode(IntEnum):
    """What the claim script answers per (task, tenant, window)."""

    TAKEN = 0  # another replica or a run-now already has the window
    FIRE = 1  # this caller must send it
    IN_FLIGHT = 2  # the previous run is still going: consumed, recorded as skipped
    MARKED = 3  # a mark entry: the task's window was handled (no tenant to fire)


@unique
class CronClaimKind(StrEnum):
    """What the claim script does with an entry."""

    SINGLETON = "S"  # take the window and the in-flight key, then record
    OVERLAP = "O"  # take the window key only (overlap=allow): a run in flight does not skip
    NON_SINGLETON = "N"  # no keys to take: record the firing
    MARK = "M"  # only move the task's last handled window
    CUSTOM = "C"  # as OVERLAP, guarded by and advancing the task's shared last run (cron_ref)


@unique
class CronSource(StrEnum):
    """Where a scheduled task is declared (``schedule list`` shows it)."""

    CRON = "@cron"
    BEAT_SCHEDULE = "beat_schedule"
    RUNTIME = "runtime"


@unique
class Overlap(StrEnum):
    """What a window does while the task's previous run is still in flight."""

    SKIP = "skip"  # the window is consumed and recorded as skipped (the default)
    ALLOW = "allow"  # it fires anyway


@unique
class RuntimeField(StrEnum):
    """Fields of a runtime schedule hash (``Keys.cron_runtime``); values as validated text."""

    TASK = "task"  # Celery task name
    CRON = "cron"  # a cron spec (our parser), or empty
    EVERY = "every"  # seconds of an interval, or empty
    ARGS = "args"  # JSON list
    KWARGS = "kwargs"  # JSON object
    QUEUE = "queue"  # or empty: the app's router decides
    PER_TENANT = "per_tenant"  # "1" / "0"
    TIMEZONE = "timezone"  # IANA name, or empty: the app's
    TIMEOUT = "timeout"  # seconds
    GRACE = "grace"  # seconds, or empty: the app's CHECKBEAT_CRON_GRACE
    OVERLAP = "overlap"  # an Overlap value
    PAUSED = "paused"  # "1" / "0"
    EXPECTED_DURATION = "expected_duration"  # seconds, or empty (absent): the timeout


LUA_FIELD_TABLES.update(
    {
        "CRON_STATE": CronStateField,
        "CRON_STATS": CronStatsField,
        "CRON_GAP": CronGapField,
        "CRON_PENDING": CronPendingField,
        "CRON_OUTCOME": CronOutcome,
        "CRON_SKIP": CronSkipReason,
        "CRON_CLAIM": CronClaimCode,
        "CRON_CLAIM_KIND": CronClaimKind,
    }
)


# --- check state and transitions -------------------------------------------------------------


def maintenance_scope(*, uid: str | None = None, tenant: str | None = None) -> str:
    """The scope of a check's or a tenant's maintenance windows (exactly one is given)."""
    if (uid is None) == (tenant is None):
        raise ValueError("give exactly one of uid and tenant")
    return f"check:{uid}" if uid is not None else f"tenant:{tenant}"


@unique
class CheckStateField(StrEnum):
    """Fields of a check's state hash (``Keys.check_state``)."""

    STATE = "s"  # the announced overall state (the last transition's "to"); absent = up
    OBSERVED = "o"  # the overall state the regions show now (differs inside a window)
    SINCE = "at"  # Unix s of the last transition
    SEQ = "n"  # transitions so far; the next one's id is <uid>#<SEQ+1>
    LAST_TRANSITION = "lt"  # id of the last transition
    # Unix s a held transition waits for (a window's end), while held; every region's job
    # carries JobField.HOLD meanwhile, so its runs count the state again
    HELD_UNTIL = "hu"
    # Unix s of the first result that counted the check's state (HSETNX): where its uptime
    # history starts (checks/uptime.py); absent on a check that has not run yet
    FIRST = "fr"


@unique
class TransitionField(StrEnum):
    """Keys of a transition's JSON (streams, outbox payload, the hook's argument)."""

    ID = "id"  # <uid>#<seq>: the hook's idempotency key
    UID = "uid"
    TENANT = "tenant"
    FROM = "from"  # a health.State
    TO = "to"
    AT = "at"  # Unix s
    REGIONS = "regions"  # {region: {"state": ..., "result": <last RunRecord JSON> | null}}
    HELD = "held"  # true when it was held back by a maintenance window and delivered at its end
    STATE = "state"  # inside REGIONS
    RESULT = "result"  # inside REGIONS
    RECORD = "json"  # the stream entry field that holds the JSON (next to ID)


@unique
class TransitionStart(StrEnum):
    """What transition_start.lua answers a delivery."""

    RUN = "run"  # this delivery runs the hooks
    DONE = "done"  # already delivered (or unknown): drop the message
    BUSY = "busy"  # another delivery holds it now: drop (its lease expiry republishes)


@unique
class DeliveryOutcome(StrEnum):
    """How a delivery of a transition ended (transition_finish.lua)."""

    DELIVERED = "delivered"  # the hooks returned: the transition leaves the outbox
    RETRY = "retry"  # a hook raised: the queue retries the same message
    FAILED = "failed"  # retries exhausted: kept in Keys.transition_failed


class NotifyOutcomeField(StrEnum):
    """Keys of a target's JSON record in ``Keys.notify_outcomes``."""

    TARGET = "target"  # the target's URL, secrets masked (as shown)
    SCOPE = "scope"  # check:<uid> or tenant:<tenant>
    OK = "ok"  # true once it was sent
    AT = "at"  # Unix s of the last attempt
    ATTEMPTS = "attempts"  # sends tried so far
    ERROR = "error"  # the last failure, scrubbed of the target's secrets; absent when ok


#: The field of ``Keys.notify_outcomes`` set when every ``@on_transition`` hook returned (a
#: retry for a failed target does not run them again); not a target id (ids are ``is_id``).
HOOKS_DONE = "#hooks"
#: Seconds a transition's delivery record outlives its last write (30 days).
NOTIFY_RECORD_TTL_S = 30 * 86_400


LUA_FIELD_TABLES.update(
    {
        "CHECK_STATE": CheckStateField,
        "DELIVERY": DeliveryOutcome,
        "TRANSITION": TransitionField,
        "TRANSITION_START": TransitionStart,
        "STATE": State,
    }
)
