"""Per-tenant token buckets (runs per minute, burst), consulted by the claim script.

A job its tenant's bucket turns away moves to the tenant's held index (``Keys.held``) at its
old effective deadline, never re-anchored; tokens release held jobs oldest deadline first, so
the next token goes to whichever of the tenant's due jobs has waited longest. With a bucket
smaller than the tenant's demand every check still runs, within ceil(demand / rate) windows,
instead of the same checks losing every window for hours. Each tick a
held job misses is counted as a skipped run (``sk``) and its scheduled_at moves on to the latest
tick. Held jobs are out of the ready index, so they never hold back other tenants' claims.

With several partitions of the check half (``CHECKBEAT_CHECK_PARTITIONS``) a tenant's bucket is
cut in one per partition, each with its share of the rate and of the burst (at least one token),
since a claim touches one partition: the tenant's runs stay within its rate, and with checks
spread evenly by the uid hash each partition's share matches its share of the demand.

Every tenant with a bucket is in ``Keys.rate_limited_tenants`` (written in the bucket's own
transaction, with ``Keys.claim_tenants_version`` moved so claimers read the set again): the
claim declares those buckets in its KEYS, and treats any other tenant as unlimited. A bucket
written around this module is found by the repair (:func:`index_rate_limits`). A completion's
hand-off of its freed slot (``complete.lua``) takes no job of a tenant in the set, by the copy
its process read within ``LIMITED_REFRESH_S`` (:class:`LimitedTenantsCache`): a new bucket
reaches the hand-offs within that, the claims at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from celery_app.errors import CheckFieldError
from celery_app.names import TENANT_RULE, is_tenant
from celery_app.redis.kept import KeptReadings
from celery_app.redis.schema import BucketField, Keys

#: Bounds of a bucket. A rate may be a fraction (0.5 = one run every two minutes); a burst below
#: one token could never admit a run, so it is refused rather than quietly raised.
MAX_PER_MINUTE = 1_000_000.0
MIN_BURST = 1.0
MAX_BURST = 1_000_000.0


@dataclass(frozen=True)
class RateLimit:
    tenant: str
    per_minute: float
    burst: float
    tokens: float | None = None


def set_rate_limit(
    client: redis.Redis, keys: Keys, tenant: str, *, per_minute: float, burst: float
) -> RateLimit:
    """Create or change a tenant's bucket (a new bucket starts full).

    CheckFieldError names ``tenant``, ``per_minute`` (> 0 and <= 1,000,000) or ``burst``
    (>= 1 and <= 1,000,000) before anything is written.
    """
    per_minute, burst = validate_rate_limit(tenant, per_minute, burst)
    share_rate, share_burst = per_minute / keys.partitions, max(MIN_BURST, burst / keys.partitions)
    fields: dict[str, str] = {
        BucketField.RATE: repr(share_rate),
        BucketField.BURST: repr(share_burst),
    }
    if keys.partitions > 1:
        fields |= {BucketField.SET_RATE: repr(per_minute), BucketField.SET_BURST: repr(burst)}
    for part in keys.every_partition():
        key = part.rate_limit(tenant)
        pipe = client.pipeline(transaction=True)  # a bucket is never outside the index
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # str keys are fine
        pipe.hsetnx(key, BucketField.TOKENS, repr(share_burst))
        pipe.sadd(part.rate_limited_tenants(), tenant)
        pipe.incr(part.claim_tenants_version())  # claimers read the set again
        pipe.execute()
    return RateLimit(tenant, per_minute, burst, _tokens(client, keys, tenant))


def validate_rate_limit(tenant: str, per_minute: object, burst: object) -> tuple[float, float]:
    """``(per_minute, burst)`` as floats, or CheckFieldError naming ``tenant``, ``per_minute``
    or ``burst`` and the allowed range (``set_rate_limit`` and ``checks apply`` call it)."""
    if not is_tenant(tenant):
        raise CheckFieldError("tenant", f"{tenant!r} is not allowed: use {TENANT_RULE}")
    if not _number_within(per_minute, 0, MAX_PER_MINUTE, low_open=True):
        raise CheckFieldError(
            "per_minute",
            f"must be a number > 0 and <= {MAX_PER_MINUTE:,.0f} runs per minute (fractions such "
            f"as 0.5 allowed), got {per_minute!r}",
        )
    if not _number_within(burst, MIN_BURST, MAX_BURST, low_open=False):
        raise CheckFieldError(
            "burst", f"must be a number >= {MIN_BURST:g} and <= {MAX_BURST:,.0f}, got {burst!r}"
        )
    return float(per_minute), float(burst)  # type: ignore[arg-type]  # numbers: checked above


def default_burst(per_minute: float) -> float:
    """The bucket size when none is given: one minute of runs, but at least one token (a rate
    of 0.5/min still gets a bucket that can hold the one run it allows every two minutes)."""
    return max(MIN_BURST, float(per_minute))


def _number_within(value: object, low: float, high: float, *, low_open: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int) and abs(value) > high:  # float() of a huge int overflows
        return False
    number = float(value)
    above = number > low if low_open else number >= low
    return math.isfinite(number) and above and number <= high


def clear_rate_limit(client: redis.Redis, keys: Keys, tenant: str) -> bool:
    """Remove the bucket: the tenant is unlimited again. False if it had none."""
    found = False
    for part in keys.every_partition():
        pipe = client.pipeline(transaction=True)  # (a cluster pipeline's default is none)
        pipe.delete(part.rate_limit(tenant))
        pipe.srem(part.rate_limited_tenants(), tenant)
        pipe.incr(part.claim_tenants_version())  # claimers read the set again
        deleted, _, _ = pipe.execute()
        found = found or bool(deleted)
    return found


#: How old a process's copy of a partition's rate-limited tenants may be for a hand-off to go
#: by it: a bucket set applies to the completions' hand-offs within this (to claims at once).
LIMITED_REFRESH_S = 1.0
#: Most tenants a copy is kept of: past that the hand-off asks Redis for its one tenant.
MAX_KEPT_LIMITED = 256


class LimitedTenantsCache:
    """The tenants with a bucket (``Keys.rate_limited_tenants``) as this process last read
    them, per partition. A completion's hand-off takes a job only of a tenant without one
    (``complete.lua``); the set changes when an operator sets or clears a bucket, rarely, so
    the completion sends the copy when it is fresh instead of asking Redis on every hand-off,
    and reads the set again on its own round trip when it is not.

    Not the claimer's copy (``claiming._Cached.limited``): that one is checked against the
    tenant sets' version on every claim, and carries no age; a worker whose slots are handed
    off claims rarely, so its claimer's copy may be any age."""

    def __init__(self) -> None:
        self._kept: KeptReadings[frozenset[str] | None] = KeptReadings(LIMITED_REFRESH_S)

    def fresh(self, keys: Keys) -> frozenset[str] | None:
        """The copy of ``keys``' partition when read within ``LIMITED_REFRESH_S`` and small
        enough to send, else None (ask Redis)."""
        return self._kept.fresh(keys.rate_limited_tenants())

    def due(self, keys: Keys) -> bool:
        """Whether to read the set again now (:meth:`KeptReadings.due`)."""
        return self._kept.due(keys.rate_limited_tenants())

    def read(self, keys: Keys, tenants: set[str], read_at: float) -> None:
        """The set as read at ``read_at`` (monotonic s: when the read was sent)."""
        kept = frozenset(tenants) if len(tenants) <= MAX_KEPT_LIMITED else None
        self._kept.read(keys.rate_limited_tenants(), kept, read_at)

    def forget(self) -> None:
        """Drop every copy (tests that write buckets between runs of one process)."""
        self._kept.forget()


#: The process's copy (completions run on many threads; a dict read or write is atomic).
KNOWN_LIMITED = LimitedTenantsCache()


def index_rate_limits(client: redis.Redis, keys: Keys) -> list[str]:
    """Add every bucket's tenant missing from ``Keys.rate_limited_tenants`` (buckets written
    before the index existed, or by hand), in every partition; the tenants added. The repair
    runs it."""
    added: set[str] = set()
    for part in keys.every_partition():
        head = part.rate_limit("")
        tenants = [
            key[len(head) :] for key in client.scan_iter(match=f"{head}*", count=1000, _type="hash")
        ]
        missing = sorted(set(tenants) - client.smembers(part.rate_limited_tenants()))
        if missing:
            pipe = client.pipeline(transaction=True)
            pipe.sadd(part.rate_limited_tenants(), *missing)
            pipe.incr(part.claim_tenants_version())  # claimers read the set again
            pipe.execute()
            added.update(missing)
    return sorted(added)


def get_rate_limit(client: redis.Redis, keys: Keys, tenant: str) -> RateLimit | None:
    """The tenant's bucket as set (the whole tenant's rate and burst), its tokens summed over
    the partitions; None if it has none."""
    h = client.hgetall(keys.at(0).rate_limit(tenant))
    if not h:
        return None
    rate = h.get(BucketField.SET_RATE) or h[BucketField.RATE]
    burst = h.get(BucketField.SET_BURST) or h[BucketField.BURST]
    return RateLimit(tenant, float(rate), float(burst), _tokens(client, keys, tenant))


def _tokens(client: redis.Redis, keys: Keys, tenant: str) -> float | None:
    """The tokens a tenant's buckets hold, summed over the partitions (None before any claim
    wrote them)."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        pipe.hget(part.rate_limit(tenant), BucketField.TOKENS)
    tokens = [float(t) for t in pipe.execute() if t]
    return sum(tokens) if tokens else None
