"""Telling a clock step from a stall: pure decisions on (wall, steady) readings, no I/O.

Why: a beat blocked for a while (a Redis failover, a long GC, SIGSTOP) resumes to a wall clock far
ahead of its last tick, and so does a beat whose wall clock was stepped forward. Only the second
must be distrusted: during a stall the steady (monotonic) clock advances as much as the wall
clock, in a step it does not. So a step is wall progress minus steady progress beyond a
tolerance, and that is only meaningful when each wall reading is paired with a steady reading
taken at the same moment: a wall time read *before* a stall paired with a steady time read
*after* it looks exactly like a forward step of the stall's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: Steady seconds two steady reads around one wall read may differ by and still pair with it.
PAIR_TOLERANCE_S = 0.5


@dataclass(frozen=True)
class Reading:
    """A wall time (epoch seconds) and a steady time read together."""

    wall: float
    steady: float


def pairs(steady_before: float, steady_after: float, tolerance: float = PAIR_TOLERANCE_S) -> bool:
    """Whether a wall read between these two steady reads belongs to either: nothing (no stall)
    came between them."""
    return 0.0 <= steady_after - steady_before <= tolerance


def wall_lead(anchor: Reading, now: Reading) -> float:
    """Seconds the wall clock advanced beyond the steady clock since ``anchor`` (negative: it
    fell behind). A stall leaves this near 0; a clock step moves it by the step."""
    return (now.wall - anchor.wall) - (now.steady - anchor.steady)


class StepVerdict(Enum):
    IN_STEP = "in_step"  # wall and steady agree (within tolerance): a stall is in step too
    HOLD = "hold"  # the wall jumped ahead: fire by the steady clock for now
    ACCEPT = "accept"  # the wall has been ahead for the whole hold: follow it


def judge(lead: float, tolerance: float, held_for: float | None, hold: float) -> StepVerdict:
    """What to make of ``lead`` (:func:`wall_lead`): ``held_for`` is the steady seconds a
    forward step has been held so far (``None``: none is), ``hold`` how long one may be."""
    if lead <= tolerance:
        return StepVerdict.IN_STEP
    if (held_for or 0.0) < hold:
        return StepVerdict.HOLD
    return StepVerdict.ACCEPT


__all__ = ["PAIR_TOLERANCE_S", "Reading", "StepVerdict", "judge", "pairs", "wall_lead"]
