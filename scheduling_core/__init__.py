"""Pure scheduling math for checkbeat: no I/O, no Celery, no Redis; standard library only.

Cost-aware, plan-weighted ordering (WFQ deadlines), cost-aware execution timeouts, lanes with
hysteresis, phase alignment of recurring jobs, and the five-field cron parser (``parse``,
``Schedule``, ``CronError``), exact to cronie.
Instants are timezone-aware datetimes, durations timedeltas, cost and delay float ms.
"""

from scheduling_core.constants import (
    COST_OFFSET_WEIGHT,
    DEFAULT_EXECUTION_TIMEOUT,
    EWMA_ALPHA,
    LANE_FAST,
    LANE_SLOW,
    MAX_DEPRIORITIZE_OFFSET,
)
from scheduling_core.cron import CronError, Schedule, parse
from scheduling_core.ewma import delay_sample_ms, update_ewma
from scheduling_core.lanes import classify_lane
from scheduling_core.params import Params, PostExecInput, PostExecState
from scheduling_core.phases import (
    first_aligned,
    jitter_for,
    next_aligned,
    region_index,
    region_spread,
)

__all__ = [
    "COST_OFFSET_WEIGHT",
    "DEFAULT_EXECUTION_TIMEOUT",
    "EWMA_ALPHA",
    "LANE_FAST",
    "LANE_SLOW",
    "MAX_DEPRIORITIZE_OFFSET",
    "CronError",
    "Params",
    "PostExecInput",
    "PostExecState",
    "Schedule",
    "classify_lane",
    "delay_sample_ms",
    "first_aligned",
    "jitter_for",
    "next_aligned",
    "parse",
    "region_index",
    "region_spread",
    "update_ewma",
]
