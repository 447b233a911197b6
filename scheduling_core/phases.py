"""Where in its period a job fires: per-check jitter, region offsets, the next aligned tick.

Every function here must give the same answer on every process and every restart (reconcile,
create and the worker's release path each recompute a job's phase), so nothing here may depend
on Python's per-process ``hash()`` or on the order callers list regions in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import lru_cache

from scheduling_core import _instant
from scheduling_core._time import require_aware

_ZERO = timedelta(0)
_ONE_SECOND = timedelta(seconds=1)
_ONE_US = timedelta(microseconds=1)


@lru_cache(maxsize=1 << 16)
def _uid_hash(check_uid: str) -> int:
    """Unsigned 64-bit hash of the uid: unkeyed BLAKE2b with an 8-byte digest, big-endian.

    Part of the persisted contract: changing it moves every check's phase. Cached: every run
    of a check computes its next tick, and the same uid always hashes the same.
    """
    digest = hashlib.blake2b(check_uid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def jitter_for(check_uid: str, base_period: timedelta) -> timedelta:
    """A stable, check-scoped offset in ``[0, base_period)``, at microsecond resolution.

    Different checks get different offsets, spreading them over the period instead of herding
    on one tick; the same uid always gets the same offset, across processes and restarts.
    ``base_period <= 0`` gives 0 (no spreading possible).
    """
    if not isinstance(check_uid, str):
        raise TypeError(f"check_uid must be a str, got {type(check_uid).__name__}")
    if base_period <= _ZERO:
        return _ZERO
    period_us = base_period // _ONE_US
    return timedelta(microseconds=_uid_hash(check_uid) % period_us)


def region_index(region: str | None, regions: Iterable[str]) -> int:
    """Index of ``region`` in a sorted copy of ``regions``, so every caller agrees on it.

    0 when ``region`` is None, ``regions`` is empty, or ``region`` is not listed (a stale job
    about to be reconciled away, or a no-region job): 0 degrades to "jitter-only phase"
    rather than an error. With duplicates, the first position wins.
    """
    if region is None:
        return 0
    ordered = sorted(regions)
    try:
        return ordered.index(region)
    except ValueError:
        return 0


def region_spread(base_period: timedelta, n: int, override: timedelta | None) -> timedelta:
    """The offset between consecutive regions' phases.

    ``override`` (the check's optional region_spread) is used verbatim: callers validate it at
    write time and the modulo in ``next_aligned`` tolerates any value. Otherwise the default
    is ``base_period / n`` (floored to the microsecond), giving the tenant a global detection
    interval of period/n; ``n <= 1`` or ``base_period <= 0`` gives 0.
    """
    if override is not None:
        return override
    if n <= 1 or base_period <= _ZERO:
        return _ZERO
    return base_period // n


def next_aligned(
    now: datetime,
    base_period: timedelta,
    job_period: timedelta,
    check_uid: str,
    region: str | None,
    regions: Iterable[str],
    spread: timedelta,
) -> datetime:
    """``now`` advanced by whole seconds, at least 1 and at most ``job_period``, to the next
    instant whose Unix second is congruent to the job's phase modulo ``job_period``.

    The phase is ``jitter_for(check_uid, base_period) + region_index × spread`` modulo
    ``job_period``, floored to a whole second. now's sub-second part is carried over. When now
    already sits inside the phase-aligned second the result is a full period later: a check
    that just fired on its tick must not fire again within the same second.

    ``base_period <= 0`` or ``job_period <= 0`` falls back to ``now + job_period`` (never
    produced by reconcile; avoids a modulo by zero). A positive ``job_period`` must be a whole
    number of seconds, since the alignment is on Unix seconds. Any period or spread a timedelta
    can hold is computed without OverflowError (the result saturates like ``_instant.add``).
    """
    require_aware(now, "now")
    if base_period <= _ZERO or job_period <= _ZERO:
        return _instant.add(now, job_period)
    if job_period % _ONE_SECOND:
        raise ValueError(
            f"job_period must be a whole number of seconds, got {job_period!r}; "
            "next_aligned aligns on Unix seconds"
        )
    period_s = job_period // _ONE_SECOND
    # Integer microseconds: ``index × spread`` as a timedelta overflows for a huge spread, and
    # the modulo makes any spread equivalent to one below the period anyway.
    jitter_us = jitter_for(check_uid, base_period) // _ONE_US
    offset_us = region_index(region, regions) * (spread // _ONE_US)
    phase_s = ((jitter_us + offset_us) % (job_period // _ONE_US)) // 1_000_000
    ahead_s = (phase_s - _instant.unix_second(now)) % period_s
    return _instant.add(now, timedelta(seconds=ahead_s or period_s))


def first_aligned(
    now: datetime,
    base_period: timedelta,
    job_period: timedelta,
    check_uid: str,
    region: str | None,
    regions: Iterable[str],
    spread: timedelta,
) -> datetime:
    """A new job's first tick: :func:`next_aligned`, except that ``now`` itself is the tick
    when it sits inside the phase-aligned second (at most ``job_period`` minus a second ahead).

    Why: :func:`next_aligned` skips now's own second so that a job that just fired does not
    fire again within it; a job being placed has not fired, and skipping made one new check in
    every ``period_s`` wait a whole period for its first run (behind every other new check's
    first run, in the overload bench's second period). Same arguments as :func:`next_aligned`.
    """
    require_aware(now, "now")
    if base_period <= _ZERO or job_period <= _ZERO or job_period % _ONE_SECOND:
        return next_aligned(now, base_period, job_period, check_uid, region, regions, spread)
    before = next_aligned(
        now - _ONE_SECOND, base_period, job_period, check_uid, region, regions, spread
    )
    return max(before, now)
