"""Lane classification with hysteresis, from the cost EWMA only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduling_core.constants import LANE_FAST, LANE_SLOW

if TYPE_CHECKING:
    from scheduling_core.params import Params


def classify_lane(prev_lane: int, cost_ewma_ms: float, params: Params) -> int:
    """The lane a job belongs to after folding in its latest cost EWMA.

    Promote to LANE_SLOW at ``cost >= lane_slow_threshold_ms``, demote to LANE_FAST below
    ``lane_fast_threshold_ms``, and hold ``prev_lane`` inside the band so a check hovering at
    one edge does not flip lanes every run. Cost only: delay is a victim signal, and
    classifying on it would send starved fast checks to the slow lane. A fresh job (cost 0,
    lane FAST) is never promoted, so it stays fast. ``lane_slow_threshold_ms <= 0`` turns the
    classifier off and returns ``prev_lane`` unchanged.
    """
    if not params.lane_slow_threshold_ms > 0:
        return prev_lane
    if cost_ewma_ms >= params.lane_slow_threshold_ms:
        return LANE_SLOW
    if cost_ewma_ms < params.lane_fast_threshold_ms:
        return LANE_FAST
    return prev_lane
