"""Pure scheduling math for checkbeat: no I/O, no Celery, no Redis; standard library only.

A port of the Go ``scheduling`` seed. Instants are timezone-aware datetimes, durations
timedeltas, cost and delay float ms.
"""

from scheduling_core.ewma import delay_sample_ms, update_ewma
from scheduling_core.phases import jitter_for, next_aligned, region_index, region_spread

__all__ = [
    "delay_sample_ms",
    "jitter_for",
    "next_aligned",
    "region_index",
    "region_spread",
    "update_ewma",
]
