"""Per-tenant token buckets (runs per minute, burst), consulted by the claim script.

A job its tenant's bucket turns away moves to the tenant's held index (``Keys.held``) at its
old effective deadline, never re-anchored; tokens release held jobs oldest deadline first, so
the next token goes to whichever of the tenant's due jobs has waited longest. With a bucket
smaller than the tenant's demand every check still runs, within ceil(demand / rate) windows,
instead of the same checks losing every window for hours. Each tick a
held job misses is counted as a skipped run (``sk``) and its scheduled_at moves on to the latest
tick. Held jobs are out of the ready index, so they never hold back other tenants' claims.

Every tenant with a bucket is in ``Keys.rate_limited_tenants`` (written in the bucket's own
transaction, with ``Keys.claim_tenants_version`` moved so claimers read the set again): the
claim declares those buckets in its KEYS, and treats any other tenant as unlimited. A bucket
written around this module is found by the repair (:func:`index_rate_limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from celery_app.errors import CheckFieldError
from celery_app.names import TENANT_RULE, is_tenant
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
    key = keys.rate_limit(tenant)
    pipe = client.pipeline(transaction=True)  # a bucket is never outside the index
    pipe.hset(
        key,
        mapping={BucketField.RATE: repr(float(per_minute)), BucketField.BURST: repr(float(burst))},
    )
    pipe.hsetnx(key, BucketField.TOKENS, repr(float(burst)))
    pipe.sadd(keys.rate_limited_tenants(), tenant)
    pipe.incr(keys.claim_tenants_version())  # claimers read the set again
    pipe.execute()
    return get_rate_limit(client, keys, tenant)  # type: ignore[return-value]  # just written


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
    pipe = client.pipeline(transaction=True)  # (a cluster pipeline's default is none)
    pipe.delete(keys.rate_limit(tenant))
    pipe.srem(keys.rate_limited_tenants(), tenant)
    pipe.incr(keys.claim_tenants_version())  # claimers read the set again
    deleted, _, _ = pipe.execute()
    return bool(deleted)


def index_rate_limits(client: redis.Redis, keys: Keys) -> list[str]:
    """Add every bucket's tenant missing from ``Keys.rate_limited_tenants`` (buckets written
    before the index existed, or by hand); the tenants added. The repair runs it."""
    head = keys.rate_limit("")
    tenants = [
        key[len(head) :] for key in client.scan_iter(match=f"{head}*", count=1000, _type="hash")
    ]
    indexed = client.smembers(keys.rate_limited_tenants())
    missing = sorted(set(tenants) - indexed)
    if missing:
        pipe = client.pipeline(transaction=True)
        pipe.sadd(keys.rate_limited_tenants(), *missing)
        pipe.incr(keys.claim_tenants_version())  # claimers read the set again
        pipe.execute()
    return missing


def get_rate_limit(client: redis.Redis, keys: Keys, tenant: str) -> RateLimit | None:
    h = client.hgetall(keys.rate_limit(tenant))
    if not h:
        return None
    return RateLimit(
        tenant,
        float(h[BucketField.RATE]),
        float(h[BucketField.BURST]),
        float(h[BucketField.TOKENS]) if h.get(BucketField.TOKENS) else None,
    )
