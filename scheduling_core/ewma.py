"""The two millisecond signals: the EWMA fold and the scheduling-delay sample."""

from __future__ import annotations

from datetime import datetime

from scheduling_core import _instant
from scheduling_core._time import require_aware
from scheduling_core.constants import EWMA_ALPHA


def update_ewma(prev: float, sample_ms: float) -> float:
    """Fold one millisecond sample into a running EWMA (cost and delay alike).

    ``prev <= 0`` means "no data yet": the sample seeds the average, so it converges from the
    first run instead of starting biased toward 0. Negative samples (backwards clocks) are
    floored at 0. NaN is treated like "no data" on both sides, so a poisoned stored value
    heals on the next run instead of sticking forever.
    """
    sample = float(sample_ms) if sample_ms > 0 else 0.0  # also maps NaN to 0
    if not prev > 0:  # also catches NaN
        return sample
    return EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * float(prev)


def delay_sample_ms(
    scheduled_at: datetime | None,
    effective_scheduled_at: datetime | None,
    exec_start: datetime,
) -> float:
    """How late the probe started versus the schedule the user configured, in ms, floored at 0.

    The runner waits for scheduled_at, so with spare capacity this is 0; it only goes
    positive under contention. The stored effective deadline is the fallback when a job has
    no scheduled_at (should not happen); with neither there is nothing to measure: 0.
    Telemetry only: nothing reads the delay back to order or classify jobs.
    """
    require_aware(exec_start, "exec_start")
    if scheduled_at is not None:
        require_aware(scheduled_at, "scheduled_at")
    if effective_scheduled_at is not None:
        require_aware(effective_scheduled_at, "effective_scheduled_at")
    reference = scheduled_at if scheduled_at is not None else effective_scheduled_at
    if reference is None:
        return 0.0
    return max(0.0, _instant.elapsed_ms(exec_start, reference))
