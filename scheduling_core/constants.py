"""Constants of the scheduling math, kept together so the three 15 s-derived values agree."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

#: The default lane. Checks whose cost EWMA sits below the hysteresis band; new jobs start
#: here, so a job's first run is plain FIFO.
LANE_FAST: Final = 0

#: The capacity-capped lane for expensive checks (cost EWMA at or above the slow threshold).
#: Lanes are small ints, not a bool, so a third class can be added later.
LANE_SLOW: Final = 1

#: Multiplier on cost_ewma_ms in the deprioritization offset. An expensive check holds a
#: worker slot for its whole run, so it is pushed back harder than its raw cost to give fast
#: checks first pick of a contended slot.
COST_OFFSET_WEIGHT: Final = 2

#: Flat per-check execution ceiling when no check timeout is configured. It is also the value
#: a timed-out run's cost sample is pinned to and the basis of MAX_DEPRIORITIZE_OFFSET, so the
#: three stay consistent.
DEFAULT_EXECUTION_TIMEOUT: Final = timedelta(seconds=15)

#: Smoothing factor for the cost and delay EWMAs: value = α·sample + (1−α)·prev. Modest, so
#: one blip does not dominate but a sustained change shows within a handful of runs.
EWMA_ALPHA: Final = 0.3

#: Hard ceiling on the deprioritization offset (30 s = weight × 15 s ceiling). Being far below
#: the claim window is the anti-starvation guarantee: a job more than this overdue sorts ahead
#: of any on-time job. The explicit clamp keeps any future offset term from reintroducing the
#: unbounded offsets that once stranded jobs for an hour and a half.
MAX_DEPRIORITIZE_OFFSET: Final = COST_OFFSET_WEIGHT * DEFAULT_EXECUTION_TIMEOUT
