"""The tunable knobs and the per-job accounting that reads them.

Every knob defaults to 0, meaning "feature off", so ``Params()`` reproduces plain FIFO order
with the flat 15 s ceiling. Durations are ``timedelta``; thresholds are float milliseconds to
match cost_ewma_ms.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from numbers import Real
from typing import Any, Self

from scheduling_core import _instant
from scheduling_core._time import require_aware
from scheduling_core.constants import (
    COST_OFFSET_WEIGHT,
    DEFAULT_EXECUTION_TIMEOUT,
    MAX_DEPRIORITIZE_OFFSET,
)
from scheduling_core.ewma import delay_sample_ms, update_ewma
from scheduling_core.lanes import classify_lane

_ZERO = timedelta(0)
_ONE_MS = timedelta(milliseconds=1)
_ONE_US = timedelta(microseconds=1)
_MAX_OFFSET_MS = MAX_DEPRIORITIZE_OFFSET / _ONE_MS
#: The largest credit: -timedelta.min, so ``offset - credit`` is still a timedelta.
_MAX_CREDIT_US = -timedelta.min // _ONE_US
_DURATION_FIELDS = frozenset(
    {"tier_credit_per_weight", "tier_credit_max", "check_timeout", "cost_timeout_floor"}
)


@dataclass(frozen=True, slots=True)
class Params:
    """Every knob the scheduling math reads; built once from settings, immutable.

    - ``slow_threshold_ms``: dead band on the deprioritization offset. The offset
      (cost × COST_OFFSET_WEIGHT) applies only once it reaches this many ms, so small per-run
      variance never reorders fast checks. 0 turns the dead band off (any positive offset
      applies).
    - ``tier_credit_per_weight``: deadline credit per unit of plan_weight (paid jobs sort
      earlier under contention). 0 turns tier credit off.
    - ``tier_credit_max``: cap on the total tier credit, so a huge weight cannot pull a job
      arbitrarily far into the past and starve free work. 0 = no separate cap.
    - ``check_timeout``: global execution ceiling; 0 = unset, i.e. 15 s.
    - ``cost_timeout_factor``: multiplies cost_ewma_ms into a per-check timeout clamped to
      [cost_timeout_floor, ceiling]. 0 turns the cost-aware timeout off (flat ceiling).
    - ``cost_timeout_floor``: minimum cost-aware timeout, so a fast check is never given an
      unreasonably short one. Read only when the factor is > 0.
    - ``lane_slow_threshold_ms``: promote edge of the lane band; <= 0 turns lane
      classification off (jobs keep their stored lane).
    - ``lane_fast_threshold_ms``: demote edge; settings validate it is below the slow edge.

    Construction checks types (a plain number where a timedelta belongs would otherwise fail
    deep inside a method) and converts integer thresholds to float; it does not check ranges,
    which is the settings loader's job.
    """

    slow_threshold_ms: float = 0.0
    tier_credit_per_weight: timedelta = _ZERO
    tier_credit_max: timedelta = _ZERO
    check_timeout: timedelta = _ZERO
    cost_timeout_factor: float = 0.0
    cost_timeout_floor: timedelta = _ZERO
    lane_slow_threshold_ms: float = 0.0
    lane_fast_threshold_ms: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _DURATION_FIELDS:
                if not isinstance(value, timedelta):
                    raise TypeError(
                        f"Params.{f.name} must be a timedelta, got {type(value).__name__} "
                        f"({value!r})"
                    )
            elif isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(
                    f"Params.{f.name} must be a number of milliseconds (or a factor), "
                    f"got {type(value).__name__} ({value!r})"
                )
            else:
                object.__setattr__(self, f.name, float(value))

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        """Build Params from any object with attributes named like Params' fields.

        Duck-typed so this pure package never imports the settings module. Every field must
        be present (a renamed setting should fail loudly, not silently turn a feature off);
        ``None`` means unset, i.e. 0 = off.
        """
        values: dict[str, Any] = {}
        missing: list[str] = []
        for f in fields(cls):
            try:
                value = getattr(settings, f.name)
            except AttributeError:
                missing.append(f.name)
                continue
            if value is not None:
                values[f.name] = value
        if missing:
            raise AttributeError(
                f"settings object {type(settings).__name__} lacks scheduling field(s) "
                f"{', '.join(missing)}; Params.from_settings reads all of "
                f"{', '.join(f.name for f in fields(cls))}"
            )
        return cls(**values)

    def effective_check_timeout(self) -> timedelta:
        """The execution ceiling: ``check_timeout`` when set (> 0), else 15 s.

        It is the flat timeout with the cost-aware timeout off, the upper clamp with it on,
        and the value a timed-out run's cost sample is pinned to.
        """
        return self.check_timeout if self.check_timeout > _ZERO else DEFAULT_EXECUTION_TIMEOUT

    def cost_sample_ms(self, duration_ms: float, timed_out: bool) -> float:
        """The cost sample of one run: its duration, or the ceiling if it timed out.

        Pinning timeouts to the ceiling makes a check that always times out converge to the
        maximum cost (and stay slow) instead of being scored by its truncated duration.
        """
        if timed_out:
            return self.effective_check_timeout() / _ONE_MS
        return float(duration_ms)

    def tier_credit(self, plan_weight: int) -> timedelta:
        """How far before scheduled_at a paid job's deadline is pulled.

        Free jobs (weight <= 0) and ``tier_credit_per_weight <= 0`` give none. The credit is
        ``per_weight × weight``, capped at ``tier_credit_max`` when that is > 0, so a very high
        weight cannot starve free work.
        """
        if plan_weight <= 0 or self.tier_credit_per_weight <= _ZERO:
            return _ZERO
        # Integer microseconds: a huge weight must hit the cap exactly, not overflow first; with
        # no cap, the credit saturates at ~2.7 million years (the deadline at the earliest
        # instant) instead of raising OverflowError.
        credit_us = (self.tier_credit_per_weight // _ONE_US) * plan_weight
        if self.tier_credit_max > _ZERO:
            credit_us = min(credit_us, self.tier_credit_max // _ONE_US)
        return timedelta(microseconds=min(credit_us, _MAX_CREDIT_US))

    def effective_scheduled_at(
        self, scheduled_at: datetime, cost_ewma_ms: float, plan_weight: int
    ) -> datetime:
        """The claim-order key: ``scheduled_at + offset(cost) − tier_credit(weight)``.

        The offset is ``cost × COST_OFFSET_WEIGHT`` ms, a pure offender penalty (an expensive
        check holds a slot longer, so it yields a contended slot); it is 0 below the
        ``slow_threshold_ms`` dead band so fast checks keep FIFO order, and clamped to
        MAX_DEPRIORITIZE_OFFSET (30 s). The clamp is the anti-starvation invariant: without
        tier credit, a job more than 30 s overdue sorts ahead of any on-time job. The delay
        EWMA is deliberately absent: penalising victims spiraled under overload. Claims gate
        on the real scheduled_at, so this only decides who wins when slots are contended.
        A fresh job (cost 0) and the zero Params both leave the order at scheduled_at.
        Offsets are rounded to the microsecond; a credit beyond the calendar saturates at
        ``_instant.EARLIEST`` (the job sorts first), never an OverflowError.
        """
        require_aware(scheduled_at, "scheduled_at")
        offset_ms = cost_ewma_ms * COST_OFFSET_WEIGHT
        if not offset_ms > 0 or offset_ms < self.slow_threshold_ms:  # NaN/negative: none
            offset_ms = 0.0
        offset = timedelta(milliseconds=min(offset_ms, _MAX_OFFSET_MS))
        return _instant.add(scheduled_at, offset - self.tier_credit(plan_weight))

    def execution_timeout(self, cost_ewma_ms: float) -> timedelta:
        """The per-run execution ceiling for a job with this cost EWMA.

        With ``cost_timeout_factor > 0``: ``clamp(factor × cost, floor, ceiling)`` (the ceiling
        wins if the floor exceeds it). A job with no cost signal yet (cost <= 0) gets the full
        ceiling, not the floor: a legitimately slow first run cut at the floor would pin its
        cost to the ceiling and poison the signal before it was ever measured honestly.
        Factor 0: the flat ceiling.
        """
        ceiling = self.effective_check_timeout()
        if not self.cost_timeout_factor > 0 or not cost_ewma_ms > 0:
            return ceiling
        timeout_ms = self.cost_timeout_factor * cost_ewma_ms
        if timeout_ms >= ceiling / _ONE_MS:  # compare as floats: the product may be huge
            return ceiling
        timeout = max(timedelta(milliseconds=timeout_ms), self.cost_timeout_floor)
        return min(timeout, ceiling)

    def post_exec(self, input: PostExecInput) -> PostExecState:
        """Fold one run's outcome into the job's scheduling state (the one implementation).

        Cost EWMA from the run's cost sample; delay EWMA from the start lateness, carried over
        unchanged when no exec_start is known rather than fed a made-up 0; the new effective
        deadline anchored at the next tick; the lane with hysteresis. Order and lane come from
        cost only, so a clock-skewed exec_start moves nothing but a telemetry number.
        """
        cost = update_ewma(
            input.prev_cost_ewma_ms, self.cost_sample_ms(input.duration_ms, input.timed_out)
        )
        if input.exec_start is None:
            delay = input.prev_delay_ewma_ms
        else:
            sample = delay_sample_ms(
                input.scheduled_at, input.effective_scheduled_at, input.exec_start
            )
            delay = update_ewma(input.prev_delay_ewma_ms, sample)
        return PostExecState(
            cost_ewma_ms=cost,
            delay_ewma_ms=delay,
            effective_scheduled_at=self.effective_scheduled_at(
                input.next_scheduled_at, cost, input.plan_weight
            ),
            lane=classify_lane(input.prev_lane, cost, self),
        )


@dataclass(frozen=True, slots=True)
class PostExecInput:
    """What post-exec accounting needs about one finished run.

    The job's stored state before the run (``prev_*``, ``plan_weight``), the schedule it was
    meant to start at (``scheduled_at``, with the stored ``effective_scheduled_at`` as
    fallback), the outcome (``duration_ms``, ``timed_out``), when the probe actually began
    (``exec_start``; None = unknown, e.g. an old agent) and the next tick. Datetimes must be
    timezone-aware; that is checked here, at construction.
    """

    prev_cost_ewma_ms: float
    prev_delay_ewma_ms: float
    prev_lane: int
    plan_weight: int
    scheduled_at: datetime | None
    effective_scheduled_at: datetime | None
    duration_ms: float
    timed_out: bool
    exec_start: datetime | None
    next_scheduled_at: datetime

    def __post_init__(self) -> None:
        for name in ("scheduled_at", "effective_scheduled_at", "exec_start"):
            value = getattr(self, name)
            if value is not None:
                require_aware(value, f"PostExecInput.{name}")
        require_aware(self.next_scheduled_at, "PostExecInput.next_scheduled_at")


@dataclass(frozen=True, slots=True)
class PostExecState:
    """The job's new scheduling state, written back in one atomic update."""

    cost_ewma_ms: float
    delay_ewma_ms: float
    effective_scheduled_at: datetime
    lane: int
