"""Promote and claim in two phases: read what may be touched, then one script with every key.

Why two phases: a Lua script must receive every key it touches in KEYS (so the schema stays in
Python, and so Redis Cluster could route it), but which job hashes, worker hashes, token buckets
and held indexes a claim touches is only known once the indexes have been read. So Python reads
first (pipelined), then calls the script with all those keys, and the script re-validates
everything atomically: a job that another beat or worker claimed, promoted or re-scored
meanwhile is skipped, a worker whose key expired is not counted. Concurrent claims therefore
never take a job twice nor exceed the free slots; at worst one of them comes back with fewer
claims and reads again (``stop == 'more'``).

What changes rarely (the region's workers and the slots they give, its held tenants, the
rate-limited tenants) each claimer keeps between claims (:class:`_Cached`): a claim reads the
tenant sets' version (``Keys.claim_tenants_version``, moved by every write to them), the size
of the region's worker set and the leases in flight, and reads the rest again only when one of
those moved, or the script saw other slots than the cache gave. ``claim.lua`` re-validates each
worker's hash on every call, so a worker gone or stuck counts no slot at once, cache or not.

Round trips per claim round: the region's state (the cache's checks and the leases in flight;
the full read when they fail); the top of both ready indexes (and the held jobs tokens may
release); the claim (``claim.lua``). Tenants with a bucket are few, so the claim declares all of
their buckets; past :data:`MAX_DECLARED_TENANTS` it first reads the candidates' tenants
(``tenants.lua``) and declares only theirs. Promote: the due ids, then ``promote.lua``. A claim
that follows a promote (the dispatcher's) shares the promote's two round trips for its first
round's reads (:func:`promote_and_read`): three in all, the claim script included.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis

from celery_app.checks.capacity import usable_slots
from celery_app.checks.quarantine import failing_alone, quarantine
from celery_app.redis.pipelined_scripts import ScriptPipeline
from celery_app.redis.schema import (
    BucketField,
    Keys,
    QuarantineStep,
    WorkerField,
    WorkerRoleName,
)
from celery_app.redis.scripts import run_script
from scheduling_core import LANE_FAST, LANE_SLOW
from scheduling_core._instant import EARLIEST  # where saturated date sums stop

LANES = (LANE_FAST, LANE_SLOW)
#: Fewest candidates read per lane and round (a refill after one run has one free slot, but a
#: few candidates may be rate-limited or taken by a concurrent claim).
MIN_READ = 32
#: Consecutive rounds that claimed and held nothing (every candidate was stale) before a call
#: gives up until the next tick; productive rounds are bounded by the slots and the hold limit.
MAX_IDLE_ROUNDS = 8
#: Rate-limited tenants a claim declares outright; with more, it reads the candidates' tenants.
MAX_DECLARED_TENANTS = 128
#: What the claim reads of each worker hash (as ``claim.lua`` does).
WORKER_FIELDS = (WorkerField.ROLE, WorkerField.CONCURRENCY, WorkerField.STUCK)
#: Replies of a region's full state read before its known workers' hashes (``_queue_full``).
FULL_READS = 6
#: Replies of a region's state read with a cache (``queue_state``): its two checks and the
#: leases in flight.
CACHED_READS = 4
#: Largest stored time (Unix s) or cost (ms) a claim carries: the run contract's latest time.
MAX_STORED = 253_402_300_799.0
#: The earliest effective deadline a saturated sum gives (scheduling_core's EARLIEST), Unix s.
MIN_EFFECTIVE = EARLIEST.timestamp()


def lease_token_prefix() -> str:
    """What the lease tokens of one claim script call (and of one hand-off, which takes its
    ``.1``) start with: 64 random bits in hex; the k-th job claimed gets ``<prefix>.<k>``.

    Why random and not a counter in Redis: a token must never be issued twice, not even after a
    restore rolled the data back while a worker still runs with a token issued after the
    snapshot (its completion would be taken for the new run's). A counter needs a floor from
    Redis's clock (a ``TIME`` and a ``SET`` in every call) and raising past every held token on
    reconcile, and still fails if the clock went back; 64 random bits per call cannot repeat in
    practice, cost Redis nothing and hold on any clock. When the lease was made is in the job
    already (its expiry, ``JobField.LEASE_EXPIRY``), so the token carries no time."""
    return secrets.token_hex(8)


class ClaimStop(StrEnum):
    """Why a claim script stopped (its reply's ``stop``)."""

    FULL = "full"  # no free slot left (or the call's batch was taken)
    LIMIT = "limit"  # the hold limit for rate-limited jobs was reached
    MORE = "more"  # candidates ran out while the index may hold more, or some were stale
    DONE = "done"  # every candidate was seen and the indexes hold no more


@dataclass(frozen=True)
class Claim:
    """One job claimed."""

    job_id: str
    region: str
    lane: int
    lease_token: str
    scheduled_at: float
    effective_scheduled_at: float
    cost_ewma_ms: float


@dataclass(frozen=True)
class RegionSlots:
    """A region's capacity as a claim saw it (before its claims)."""

    total: int
    slow_capacity: int
    in_flight_fast: int
    in_flight_slow: int

    @property
    def free(self) -> int:
        return self.total - self.in_flight_fast - self.in_flight_slow

    @property
    def free_slow(self) -> int:
        return min(self.slow_capacity - self.in_flight_slow, self.free)


@dataclass
class RegionClaim:
    """What :meth:`RegionClaimer.claim` took in one region."""

    slots: RegionSlots
    claims: list[Claim] = field(default_factory=list)
    rate_limited: int = 0


# --- promote ----------------------------------------------------------------------------------


@dataclass
class Promotions:
    """What promotes moved, counted across calls: the jobs put in each (region, lane) ready index
    (the dispatch metrics), and the heartbeat jobs put in the late index (beat's tick records
    their misses; when a tick moved none there, it leaves the late index to its upkeep)."""

    ready: Counter[tuple[str, int]] = field(default_factory=Counter)
    late: int = 0
    #: The earliest job left in the due index after the tick's promote (None: none left), read
    #: on the promote's round trip when ``next_due_read``; not read, or moved since by a later
    #: promote, when False (the tick then reads it after its claims).
    next_due: float | None = None
    next_due_read: bool = False


def promote_due(
    client: redis.Redis,
    keys: Keys,
    now_s: float,
    batch: int,
    into: Promotions | None = None,
) -> int:
    """Move every due job (scheduled_at <= now) into its ready index; the number moved, what
    moved where counted in ``into``."""
    total = 0
    into = Promotions() if into is None else into
    while True:
        packed = run_script(client, "due", keys=[keys.due()], args=[repr(now_s), batch])
        if not packed:
            return total
        ids = _job_ids(client, keys, packed.split("\n"), now_s)
        if not ids:
            continue
        try:
            reply = _queue_promote(client, keys, now_s, ids)
        except redis.ResponseError:
            # One job's data broke the batch (nothing was written: the writes come last):
            # promote them one by one and quarantine those that fail alone.
            total += _promote_each(client, keys, now_s, ids, into)
        else:
            total += _promoted(ids, reply, into)
        if len(ids) < batch:
            return total


def _job_ids(client: redis.Redis, keys: Keys, ids: list[str], now_s: float) -> list[str]:
    """The due ids that are job ids; one that is not can only be dropped (quarantined)."""
    for job in [j for j in ids if "@" not in j]:
        quarantine(client, keys, job, QuarantineStep.PROMOTE, "not a job id", now_s)
    return [j for j in ids if "@" in j]


def _promote_cells(ids: Sequence[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """The (region, lane) ready indexes ``promote.lua`` declares, and each job's region number."""
    regions: dict[str, int] = {}
    numbers = []
    for job in ids:
        region = job[job.rindex("@") + 1 :]
        number = regions.get(region)
        if number is None:
            number = regions[region] = len(regions) + 1
        numbers.append(str(number))
    return [(r, lane) for r in regions for lane in LANES], numbers


def _queue_promote(
    client: redis.Redis | redis.client.Pipeline, keys: Keys, now_s: float, ids: list[str]
) -> Any:
    """``promote.lua`` for ``ids`` (its reply, or queued on a pipeline)."""
    cells, numbers = _promote_cells(ids)
    return run_script(
        client,
        "promote",
        keys=[
            keys.due(),
            keys.heartbeats_late(),
            *(keys.ready(r, lane) for r, lane in cells),
            *map(keys.job, ids),
        ],
        args=[repr(now_s), len(cells) // len(LANES), "\n".join(ids), " ".join(numbers)],
    )


def _promoted(ids: list[str], reply: Any, into: Promotions) -> int:
    """How many ``promote.lua`` moved; where it put them counted in ``into``."""
    moved, *placed, late = reply
    into.ready.update(dict(zip(_promote_cells(ids)[0], placed, strict=True)))
    into.late += int(late)
    return int(moved)


def _promote_each(
    client: redis.Redis, keys: Keys, now_s: float, ids: list[str], into: Promotions
) -> int:
    """``promote.lua`` per job (one pipeline); a job whose call fails is quarantined."""
    pipe = client.pipeline(transaction=False)
    for job in ids:
        region = job[job.rindex("@") + 1 :]
        run_script(
            pipe,
            "promote",
            keys=[
                keys.due(),
                keys.heartbeats_late(),
                keys.ready(region, LANE_FAST),
                keys.ready(region, LANE_SLOW),
                keys.job(job),
            ],
            args=[repr(now_s), 1, job, "1"],
        )
    replies = pipe.execute(raise_on_error=False)
    errors = [x if isinstance(x, Exception) else None for x in replies]
    if not failing_alone(errors):
        raise next(e for e in errors if e is not None)
    moved = 0
    for job, reply in zip(ids, replies, strict=True):
        if isinstance(reply, Exception):
            quarantine(client, keys, job, QuarantineStep.PROMOTE, reply, now_s)
        else:
            moved += int(reply[0])
            region = job[job.rindex("@") + 1 :]
            into.ready.update(
                {(region, lane): int(n) for lane, n in zip(LANES, reply[1:-1], strict=True)}
            )
            into.late += int(reply[-1])
    return moved


# --- claim ------------------------------------------------------------------------------------


def bucket_tokens(fields: Sequence[str | None], now_s: float) -> float | None:
    """A bucket's tokens at ``now_s`` (``HMGET rate burst tokens ts``), None without a bucket.

    An estimate for choosing which held jobs to offer the claim script: the script refills and
    spends the bucket itself (the same rule), so a stale estimate only offers too few or too many.
    """
    rate, burst, tokens, updated = fields
    if rate is None:
        return None
    burst_f = float(burst or 0)
    tokens_f = float(tokens) if tokens else burst_f
    ts = float(updated) if updated else now_s
    if now_s > ts:
        tokens_f = min(burst_f, tokens_f + (now_s - ts) * float(rate) / 60.0)
    return tokens_f


@dataclass
class _State:
    hosts: list[str]
    held: list[str]
    limited: frozenset[str]
    slots: RegionSlots
    stale_workers: bool


@dataclass(frozen=True)
class _Cached:
    """What a claimer read of its region and reuses from claim to claim: the workers (their
    hostnames and the slots their hashes gave), the held and the rate-limited tenants.

    Why it may be stale and the claim stays right: ``claim.lua`` re-validates all of it on every
    call (each declared worker's hash: one gone or stuck counts no slot at once; a candidate's
    tenant with an undeclared bucket is left in place), so the cache only sizes the read and
    chooses what to declare. What it misses is read again: a worker added to or pruned from the
    region's set changes its size (``members``, checked with SCARD); a write to either tenant set
    moves ``Keys.claim_tenants_version`` (``version``, checked with GET); a claim script that saw
    other slots than the cache gave, or a round that took nothing and asks to read again, drops
    it (``RegionClaimer.forget``); and a cache that leaves no slot free is read again before a
    claim gives up."""

    version: str | None
    members: int
    hosts: list[str]
    total: int
    slow: int
    stale: bool
    held: list[str]
    limited: frozenset[str]


@dataclass(frozen=True)
class _StateQuery:
    """What :meth:`RegionClaimer.queue_state` queued: ``replies`` of them; with ``cache``, its
    checks (else the full read, with the hashes of the ``known`` workers)."""

    replies: int
    cache: _Cached | None
    known: list[str] = field(default_factory=list)


@dataclass
class _Read:
    """One round's candidates: per lane (ids, scores) in index order and whether the read was
    cut at its size; per offered held tenant, per lane, the held (ids, scores) to release."""

    ready: list[list[tuple[str, str]]]
    full: list[bool]
    releases: dict[str, list[list[tuple[str, str]]]]


class RegionClaimer:
    """Claims the free slots of one region (see the module docstring); keeps the region's
    worker hostnames between calls so the common round needs no separate worker read."""

    def __init__(self, client: redis.Redis, keys: Keys, region: str) -> None:
        self.client = client
        self.keys = keys
        self.region = region
        self._workers: dict[str, tuple[str | None, ...]] = {}
        self._cache: _Cached | None = None

    def claim(
        self,
        now_s: float,
        expiry_s: float,
        *,
        batch: int,
        max_holds: int,
        first: FirstRound | None = None,
    ) -> RegionClaim:
        """Claim the region's free slots, at most ``batch`` per script call, holding at most
        ``max_holds`` rate-limited jobs. A round repeats while the script asks to read more
        (``stop == 'more'``) or a full batch suggests more free slots. ``first``: the first
        round's reads, made already on the caller's pipelines (:func:`promote_and_read`)."""
        result: RegionClaim | None = None
        depth = 1  # read deeper while a round's candidates are used up by holds
        idle = 0
        while idle < MAX_IDLE_ROUNDS:
            state = first.take_state() if first else self._state()
            if result is None:
                result = RegionClaim(state.slots)
            free = min(state.slots.free, batch)
            holds_left = max_holds - result.rate_limited
            if free <= 0 or holds_left <= 0:
                if state.stale_workers:
                    # nothing to claim, but let the script prune the expired workers (its
                    # check and SREM are atomic: a worker registering now is never dropped)
                    empty = _Read([[], []], [False, False], {})
                    result.slots = self._round(state, empty, now_s, expiry_s, 0, 0)[0]
                break
            size = _read_size(free, holds_left, depth)
            read = first.take_read(size) if first else None
            first = None
            if read is None:
                read = self._read(state, size, now_s)
            if not any(read.ready) and not read.releases:
                break
            slots, stop, got, holds = self._round(state, read, now_s, expiry_s, free, holds_left)
            if not result.claims and not result.rate_limited:
                result.slots = slots  # what the first script that acted saw
            result.claims.extend(got)
            result.rate_limited += holds
            idle = 0 if got or holds else idle + 1
            if stop == ClaimStop.MORE:
                # Read deeper while a round's candidates ran out without filling the slots:
                # held (rate-limited), or new jobs at the head of the fast index waiting for a
                # shared slot, in front of measured fast jobs the reserved slots could run.
                depth = min(depth * 2, 64) if holds or len(got) < free else 1
            elif not (stop == ClaimStop.FULL and len(got) == free and slots.free > free):
                break
        assert result is not None
        return result

    # --- phase 1 ------------------------------------------------------------------------------
    def _state(self) -> _State:
        """The region's workers, held and rate-limited tenants (from the cache while it holds,
        see :class:`_Cached`) and the leases in flight."""
        pipe = self.client.pipeline(transaction=False)
        query = self.queue_state(pipe)
        return self.state_from(query, pipe.execute())

    def queue_state(self, pipe: Any) -> _StateQuery:
        """Queue :meth:`_state`'s reads on ``pipe`` (any pipeline, after other commands): with a
        cache, its checks and the leases in flight (:data:`CACHED_READS` replies); else the full
        read (:meth:`_queue_full`). For :meth:`state_from`."""
        cache = self._cache
        if cache is None:
            return self._queue_full(pipe)
        k, region = self.keys, self.region
        pipe.get(k.claim_tenants_version())
        pipe.scard(k.region_workers(region))
        pipe.zcard(k.leases(region, LANE_FAST))
        pipe.zcard(k.leases(region, LANE_SLOW))
        return _StateQuery(CACHED_READS, cache)

    def _queue_full(self, pipe: Any) -> _StateQuery:
        """The version first (a set written after it only makes the next check read again),
        the worker set, held and rate-limited tenants, the leases in flight and the hashes of
        the workers seen last time (one more round trip reads those of new ones)."""
        k, region = self.keys, self.region
        known = list(self._workers)
        pipe.get(k.claim_tenants_version())
        pipe.smembers(k.region_workers(region))
        pipe.smembers(k.held_tenants(region))
        pipe.smembers(k.rate_limited_tenants())
        pipe.zcard(k.leases(region, LANE_FAST))
        pipe.zcard(k.leases(region, LANE_SLOW))
        for host in known:
            pipe.hmget(k.worker(host), *WORKER_FIELDS)
        return _StateQuery(FULL_READS + len(known), None, known)

    def state_from(self, query: _StateQuery, replies: Sequence[Any]) -> _State:
        """The state from the replies of :meth:`queue_state` (the first error among them is
        raised). The cache serves while the version and the worker set's size are what it was
        read at and its workers leave a slot free; else the full read, one more round trip."""
        _raise_first(replies)
        cache = query.cache
        if cache is None:
            return self._full_from(query.known, replies)
        version, members, in_fast, in_slow = replies
        if version == cache.version and members == cache.members:
            slots = RegionSlots(cache.total, cache.slow, in_fast, in_slow)
            # No slot free by the cache: a worker's concurrency or stuck slots may have changed
            # since (nothing moves the version then), so read them before giving up the claim.
            if slots.free > 0:
                return _State(cache.hosts, cache.held, cache.limited, slots, cache.stale)
        pipe = self.client.pipeline(transaction=False)
        full = self._queue_full(pipe)
        return self._full_from(full.known, pipe.execute())

    def _full_from(self, known: list[str], replies: Sequence[Any]) -> _State:
        """The state from :meth:`_queue_full`'s replies, kept as the cache; a worker new since
        the last call costs one more round trip."""
        _raise_first(replies)
        version, hosts, held, limited, in_fast, in_slow, *fields = replies
        workers = dict(zip(known, map(tuple, fields), strict=True))
        missing = sorted(set(hosts) - set(known))
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for host in missing:
                pipe.hmget(self.keys.worker(host), *WORKER_FIELDS)
            workers.update(zip(missing, map(tuple, pipe.execute()), strict=True))
        current = {h: workers[h] for h in sorted(hosts)}
        self._workers = current  # a refill may run in several threads: each uses its own view
        total = slow = 0
        for role, concurrency, stuck in current.values():
            if concurrency is not None:
                slots = usable_slots(concurrency, stuck)
                total += slots
                if role == WorkerRoleName.SHARED:
                    slow += slots
        stale = any(concurrency is None for _, concurrency, _ in current.values())
        cache = _Cached(
            version, len(hosts), list(current), total, slow, stale, sorted(held), frozenset(limited)
        )
        self._cache = cache
        return _State(
            cache.hosts,
            cache.held,
            cache.limited,
            RegionSlots(total, slow, in_fast, in_slow),
            stale,
        )

    def forget(self) -> None:
        """Drop the cache: the next claim reads the region's state in full."""
        self._cache = None

    def _read(self, state: _State, size: int, now_s: float) -> _Read:
        """The top ``size`` of both ready indexes, and the held jobs that the tenants' tokens
        (an estimate, see :func:`bucket_tokens`) may release."""
        pipe = self.client.pipeline(transaction=False)
        self.queue_read(pipe, state, size)
        return self.read_from(state, size, now_s, pipe.execute())

    def queue_read(self, pipe: Any, state: _State, size: int) -> int:
        """Queue :meth:`_read`'s first round trip on ``pipe``; how many replies it adds."""
        k, region = self.keys, self.region
        slow_size = size if state.slots.free_slow > 0 else 0
        _top(pipe, [k.ready(region, LANE_FAST), k.ready(region, LANE_SLOW)], [size, slow_size])
        for tenant in state.held:
            pipe.hmget(
                k.rate_limit(tenant),
                BucketField.RATE,
                BucketField.BURST,
                BucketField.TOKENS,
                BucketField.UPDATED,
            )
        return 1 + len(state.held)

    def read_from(self, state: _State, size: int, now_s: float, replies: Sequence[Any]) -> _Read:
        """The round's candidates from the replies of :meth:`queue_read` (the first error among
        them is raised); held jobs the tokens may release cost one more round trip."""
        _raise_first(replies)
        k, region = self.keys, self.region
        slow_size = size if state.slots.free_slow > 0 else 0
        packed, *buckets = replies
        ready = [_entries(packed[0]), _entries(packed[1])]
        full = [len(ready[LANE_FAST]) >= size, slow_size > 0 and len(ready[LANE_SLOW]) >= size]
        offered: dict[str, int] = {}
        for tenant, fields in zip(state.held, buckets, strict=True):
            tokens = bucket_tokens(fields, now_s)
            n = size if tokens is None else min(size, math.floor(tokens))
            if n > 0:  # an empty bucket releases nothing; its tenant waits for tokens
                offered[tenant] = n
        releases: dict[str, list[list[tuple[str, str]]]] = {}
        if offered:
            held_keys = [k.held(region, lane, t) for t in offered for lane in LANES]
            counts = [n for n in offered.values() for _lane in LANES]
            packed = iter(_top(self.client, held_keys, counts))
            releases = {t: [_entries(next(packed)), _entries(next(packed))] for t in offered}
        return _Read(ready, full, releases)

    def _declared_tenants(self, state: _State, read: _Read) -> list[str]:
        """The tenants whose bucket and held indexes the claim declares: every rate-limited
        tenant when they are few, else those of the candidates; and the held ones offered."""
        limited = state.limited
        if len(limited) > MAX_DECLARED_TENANTS:
            ids = [job for lane in read.ready for job, _ in lane]
            of_candidates = set()
            if ids:
                packed = run_script(self.client, "tenants", keys=list(map(self.keys.job, ids)))
                of_candidates = set(packed.split("\n"))
            limited = limited & of_candidates
        return sorted(limited | set(read.releases))

    # --- phase 2 ------------------------------------------------------------------------------
    def _round(
        self,
        state: _State,
        read: _Read,
        now_s: float,
        expiry_s: float,
        max_claims: int,
        max_holds: int,
    ) -> tuple[RegionSlots, ClaimStop, list[Claim], int]:
        try:
            return self._round_once(state, read, now_s, expiry_s, max_claims, max_holds)
        except redis.ResponseError as exc:
            # A job's data broke the script: claim the candidates one by one, so the one that
            # fails alone is quarantined and every other is claimed.
            return self._round_each(state, read, now_s, expiry_s, max_claims, max_holds, exc)

    def _round_once(
        self,
        state: _State,
        read: _Read,
        now_s: float,
        expiry_s: float,
        max_claims: int,
        max_holds: int,
    ) -> tuple[RegionSlots, ClaimStop, list[Claim], int]:
        k, region = self.keys, self.region
        tenants = self._declared_tenants(state, read) if max_claims else []
        tenant_number = {t: n for n, t in enumerate(tenants, start=1)}
        # Jobs are numbered in this order: the fast candidates, the slow ones, then held jobs
        # to release that are no candidate (the script finds job j's hash at KEYS[JK + j]).
        fast = _merge(read.ready[LANE_FAST], read.releases, LANE_FAST, read.full[LANE_FAST])
        slow = _merge(read.ready[LANE_SLOW], read.releases, LANE_SLOW, read.full[LANE_SLOW])
        candidates = fast + slow
        jobs = [job for job, _ in candidates]
        numbers = {job: n for n, job in enumerate(jobs, start=1)}
        release_lines = []
        for tenant, held in read.releases.items():
            for lane in LANES:
                for job, _ in held[lane]:
                    n = numbers.get(job)
                    if n is None:
                        jobs.append(job)
                        n = numbers[job] = len(jobs)
                    release_lines.append(f"{tenant_number[tenant]} {n} {lane}")
        prefix = lease_token_prefix()
        tenant_keys = []
        for tenant in tenants:
            tenant_keys += [
                k.rate_limit(tenant),
                k.held(region, LANE_FAST, tenant),
                k.held(region, LANE_SLOW, tenant),
            ]
        reply = run_script(
            self.client,
            "claim",
            keys=[
                k.ready(region, LANE_FAST),
                k.ready(region, LANE_SLOW),
                k.leases(region, LANE_FAST),
                k.leases(region, LANE_SLOW),
                k.region_workers(region),
                k.held_tenants(region),
                k.rate_limited_tenants(),
                k.claim_tenants_version(),
                *map(k.worker, state.hosts),
                *tenant_keys,
                *map(k.job, jobs),
            ],
            args=[
                repr(now_s),
                f"{expiry_s:.3f}",
                max_claims,
                max_holds,
                len(state.hosts),
                len(tenants),
                *state.hosts,
                " ".join(tenants),
                "\n".join(jobs),
                " ".join(str(tenant_number[t]) for t in read.releases),
                "\n".join(release_lines),
                len(fast),
                len(slow),
                " ".join(score for _, score in candidates),
                "1" if read.full[LANE_FAST] else "0",
                "1" if read.full[LANE_SLOW] else "0",
                prefix,
            ],
        )
        total, slow, in_fast, in_slow, holds, stop, lines, gone = reply
        slots = RegionSlots(total, slow, in_fast, in_slow)
        stop = ClaimStop(stop)
        if (
            gone
            or (total, slow) != (state.slots.total, state.slots.slow_capacity)
            or (stop == ClaimStop.MORE and not lines and not holds)
        ):
            # a worker gone (another may have taken its place in the set), the workers' slots
            # changed (stuck slots, a new concurrency or role), or nothing was taken and the
            # script asks to read again: the next round reads the state in full
            self.forget()
        if not lines:
            return slots, stop, [], holds
        claims = []
        for n, line in enumerate(lines.split("\n"), start=1):
            j, scheduled, cost, claimed_lane = line.split(" ")
            i = int(j) - 1
            job, score = candidates[i]
            try:
                # a fast job never measured runs in the slow lane (claim.lua): its queue, lease
                lane = int(claimed_lane)
                claim = Claim(
                    job, region, lane, f"{prefix}.{n}", float(scheduled), float(score), float(cost)
                )
                check_claim(claim)
            except ValueError as exc:  # its stored times or cost are no numbers it can run on
                quarantine(self.client, self.keys, job, QuarantineStep.CLAIM, exc, now_s)
                continue
            claims.append(claim)
        return slots, stop, claims, holds

    def _round_each(
        self,
        state: _State,
        read: _Read,
        now_s: float,
        expiry_s: float,
        max_claims: int,
        max_holds: int,
        error: redis.ResponseError,
    ) -> tuple[RegionSlots, ClaimStop, list[Claim], int]:
        """:meth:`_round` for each candidate alone (after a script error), in deadline order; a
        candidate whose script fails alone is quarantined. Answers 'more': read again."""
        singles: list[tuple[tuple[float, str], str, _Read]] = []
        for lane in LANES:
            for entry in read.ready[lane]:
                ready: list[list[tuple[str, str]]] = [[], []]
                ready[lane] = [entry]
                singles.append((_order(entry), entry[0], _Read(ready, [False, False], {})))
        for tenant, held in read.releases.items():
            for lane in LANES:
                for entry in held[lane]:
                    releases: list[list[tuple[str, str]]] = [[], []]
                    releases[lane] = [entry]
                    single = _Read([[], []], [False, False], {tenant: releases})
                    singles.append((_order(entry), entry[0], single))
        if len(singles) <= 1:
            if not failing_alone([error]):
                raise error
            for _, job, _single in singles:
                quarantine(self.client, self.keys, job, QuarantineStep.CLAIM, error, now_s)
            return state.slots, ClaimStop.MORE, [], 0
        claims: list[Claim] = []
        holds = 0
        errors: list[tuple[str, redis.ResponseError | None]] = []
        for _, job, single in sorted(singles, key=lambda s: s[0]):
            if len(claims) >= max_claims:
                break
            try:
                _, _, got, held_one = self._round_once(
                    state, single, now_s, expiry_s, max_claims - len(claims), max_holds - holds
                )
            except redis.ResponseError as exc:
                errors.append((job, exc))
                continue
            errors.append((job, None))
            claims.extend(got)
            holds += held_one
        if not failing_alone([e for _, e in errors]):
            raise error
        for job, failed in errors:
            if failed is not None:
                quarantine(self.client, self.keys, job, QuarantineStep.CLAIM, failed, now_s)
        return state.slots, ClaimStop.MORE, claims, holds


class FirstRound:
    """The first round of one region's claim, read on pipelines that other reads share.

    Why: read one after another, the due ids, the promote, the region's state, the candidates
    and the claim would cost a round trip each. The state does not
    depend on the promote, so it rides with the due ids; the candidates do, so they ride after
    the promote on its pipeline (:func:`promote_and_read`). The claim script still re-validates
    everything read, so reading earlier only risks a round with fewer claims, never a wrong one.
    An error met while reading is raised by the claim (:meth:`take_state`), where it would have
    been met without the prefetch."""

    def __init__(self, claimer: RegionClaimer, *, batch: int, max_holds: int) -> None:
        self.claimer, self.batch, self.max_holds = claimer, batch, max_holds
        self.state: _State | None = None
        self.read: _Read | None = None
        self.size = 0  # of the candidates read; 0: none queued
        self.error: BaseException | None = None
        self._query: _StateQuery | None = None

    def queue_state(self, pipe: Any) -> int:
        self._query = self.claimer.queue_state(pipe)
        return self._query.replies

    def state_replies(self, replies: Sequence[Any]) -> None:
        try:
            assert self._query is not None  # queued by queue_state
            self.state = self.claimer.state_from(self._query, replies)
        except Exception as exc:  # raised by the claim, as without the prefetch
            self.error = exc

    def queue_read(self, pipe: Any) -> int:
        """Queue the candidates' read, sized as the claim's first round would; how many
        replies it adds (0: no state, or no free slot, so the claim needs no candidates)."""
        state = self.state
        if state is None or self.error is not None:
            return 0
        free = min(state.slots.free, self.batch)
        if free <= 0 or self.max_holds <= 0:
            return 0
        self.size = _read_size(free, self.max_holds, 1)
        return self.claimer.queue_read(pipe, state, self.size)

    def read_replies(self, replies: Sequence[Any], now_s: float) -> None:
        if not self.size or self.state is None:
            return
        try:
            self.read = self.claimer.read_from(self.state, self.size, now_s, replies)
        except Exception as exc:
            self.error = exc

    def discard_read(self) -> None:
        """The candidates may miss promoted jobs (the promote went job by job, or a backlog
        needed more batches): the claim reads them again."""
        self.read = None

    def take_state(self) -> _State:
        if self.error is not None:
            raise self.error
        if self.state is None:
            return self.claimer._state()
        return self.state

    def take_read(self, size: int) -> _Read | None:
        return self.read if size == self.size else None


def promote_and_read(
    client: redis.Redis,
    keys: Keys,
    now_s: float,
    batch: int,
    into: Promotions,
    rounds: Sequence[FirstRound],
    *,
    read_if_none_due: bool = True,
    lead_s: float = 0.0,
) -> tuple[int, bool]:
    """:func:`promote_due`, with the first round of each region's claim read on its two round
    trips: the due ids (``due.lua``) and the regions' states, then the promote and the
    candidates (a pipeline runs its commands in order, so the candidates include what it
    promoted). Nothing due: no promote, and no candidates read unless ``read_if_none_due``.

    ``lead_s`` (beat's tick): the due ids are read up to ``now_s + lead_s`` in that one read.
    When none of them is due at ``now_s`` (beat woke as a job entered the lead), the lead's jobs
    are promoted and the candidates read with them, so one claim round takes them with what
    waits; otherwise only the jobs due now are promoted, and the lead's wait for a round with
    the slots left. (moved, whether the lead's jobs were promoted).

    A promote re-run after NOSCRIPT runs after the pipeline's other commands: the candidates
    read are then dropped and each claim reads its own. More due than one batch: the rest is
    promoted by :func:`promote_due` and the claims read again."""
    pipe = client.pipeline(transaction=False)
    through = now_s + lead_s if lead_s > 0 else now_s
    now_arg = [repr(now_s)] if lead_s > 0 else []
    run_script(pipe, "due", keys=[keys.due()], args=[repr(through), batch, *now_arg])
    counts = [r.queue_state(pipe) for r in rounds]
    packed, *replies = pipe.execute(raise_on_error=False)
    _raise_first([packed])
    for r, part in zip(rounds, _split(replies, counts), strict=True):
        r.state_replies(part)
    due_now = None
    if lead_s > 0:
        packed, due_now = packed[0], int(packed[1])
    due = packed.split("\n") if packed else []
    at, took_lead = through, lead_s > 0
    if due_now:  # work is due now: it is claimed first, the lead's jobs with the slots left
        due, at, took_lead = due[:due_now], now_s, False
    ids = _job_ids(client, keys, due, now_s)
    if ids:
        into.next_due_read = False  # what was read before this promote is stale
    if not ids and not (read_if_none_due or took_lead):
        return 0, took_lead
    pipe = client.pipeline(transaction=False)
    if ids:
        _queue_promote(pipe, keys, at, ids)
    # beat's tick: the next due job, after the promote (a pipeline runs in order), saves the
    # tick a round trip of its own after its claims, which leave the due index as it is
    read_next = lead_s > 0
    if read_next:
        pipe.zrange(keys.due(), 0, 0, withscores=True)
    counts = [r.queue_read(pipe) for r in rounds]
    replies = pipe.execute(raise_on_error=False) if ids or read_next or any(counts) else []
    moved = 0
    one_by_one = False
    if ids:
        reply, *replies = replies
        one_by_one = isinstance(reply, redis.ResponseError)  # one job's data broke the batch
        if one_by_one:
            moved = _promote_each(client, keys, at, ids, into)
        else:
            _raise_first([reply])
            moved = _promoted(ids, reply, into)
    if read_next:
        first, *replies = replies
        _raise_first([first])
        into.next_due = float(first[0][1]) if first else None
        # promoted one by one, or again after NOSCRIPT, after this read: read it again later
        into.next_due_read = not one_by_one and not (
            ids and isinstance(pipe, ScriptPipeline) and pipe.reran_scripts
        )
    for r, part in zip(rounds, _split(replies, counts), strict=True):
        r.read_replies(part, at)
        if one_by_one:  # read before the jobs were promoted one by one: they miss them
            r.discard_read()
    if ids and isinstance(pipe, ScriptPipeline) and pipe.reran_scripts:
        # the promote got NOSCRIPT and ran again after the candidates were read: they may miss
        # what it moved, so each claim reads them again (redis/pipelined_scripts.py)
        for r in rounds:
            r.discard_read()
    if len(due) >= batch:  # a backlog: promote the rest
        moved += promote_due(client, keys, at, batch, into)
        into.next_due_read = False
        for r in rounds:
            r.discard_read()
    return moved, took_lead


def _split(replies: Sequence[Any], counts: Sequence[int]) -> list[Sequence[Any]]:
    """A shared pipeline's replies cut into each caller's part."""
    parts, start = [], 0
    for n in counts:
        parts.append(replies[start : start + n])
        start += n
    return parts


def _read_size(free: int, holds_left: int, depth: int) -> int:
    """How many candidates a round reads per lane: the free slots (at least MIN_READ, a few may
    be taken or held), deeper while holds used them up, never more than it could use."""
    return max(1, min(max(free, MIN_READ) * depth, free + holds_left))


def check_claim(claim: Claim) -> None:
    """A claim the run contract can carry: finite times and cost (ValueError otherwise). The
    effective deadline may be saturated anywhere in [EARLIEST, LATEST] (date arithmetic
    saturates); the message carries it clamped to the contract's range."""
    if (
        0.0 <= claim.scheduled_at <= MAX_STORED
        and MIN_EFFECTIVE <= claim.effective_scheduled_at <= MAX_STORED
        and 0.0 <= claim.cost_ewma_ms <= MAX_STORED
    ):
        return  # every claim of a tick: one comparison each (NaN and infinities fail them)
    for name, value, low in (
        ("scheduled_at", claim.scheduled_at, 0.0),
        ("effective_scheduled_at", claim.effective_scheduled_at, MIN_EFFECTIVE),
        ("cost_ewma_ms", claim.cost_ewma_ms, 0.0),
    ):
        if not (math.isfinite(value) and low <= value <= MAX_STORED):
            raise ValueError(f"{name} {value!r} is outside [{low:g}, {MAX_STORED:g}]")


def _raise_first(replies: Sequence[Any]) -> None:
    """A pipeline executed with ``raise_on_error=False``: the first error of a caller's replies
    is raised where that caller's own call would have raised it."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _top(client: redis.Redis | redis.client.Pipeline, keys: list[str], counts: list[int]) -> Any:
    """``top.lua``: the first ``counts[i]`` entries of ``keys[i]``, packed (0 reads nothing)."""
    return run_script(client, "top", keys=keys, args=counts)


def _entries(packed: str) -> list[tuple[str, str]]:
    """``top.lua``'s reply for one index as (member, score) pairs, the score as Redis wrote it
    (the claim script compares it with the score it reads; Python only orders by it)."""
    if not packed:
        return []
    parts = packed.split(" ")
    return list(zip(parts[0::2], parts[1::2], strict=True))


def _order(entry: tuple[str, str]) -> tuple[float, str]:
    """A sorted set's order: by score, then by member."""
    return float(entry[1]), entry[0]


def _merge(
    ready: list[tuple[str, str]],
    releases: dict[str, list[list[tuple[str, str]]]],
    lane: int,
    full: bool,
) -> list[tuple[str, str]]:
    """One lane's claim candidates in index order: the ready ones and the held ones the release
    may put back. When the ready read was cut, nothing past its last entry can be ordered."""
    seen = {job for job, _ in ready}
    released = [e for held in releases.values() for e in held[lane] if e[0] not in seen]
    if not released:
        return ready
    merged = sorted(ready + released, key=_order)
    if full and ready:
        last = _order(ready[-1])
        merged = [e for e in merged if _order(e) <= last]
    return merged
