"""What one probe run produced, as a value: the run task stores it, the post-exec folds it.

Why a value and not exceptions: a probe never raises out (a failing target is a normal result),
so the run task has one path for every outcome and the error class is data the history keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.deadline import Deadline
from workers.target_guard import AddressPolicy

#: Error classes a result may carry. ``refused`` = the target guard said no; ``error`` = a
#: custom kind raised; ``lost`` = the run never reported (its lease was reaped).
ERROR_CLASSES = frozenset(
    {"dns", "connect", "tls", "timeout", "status", "body", "refused", "error", "lost"}
)


@dataclass(frozen=True)
class ProbeResult:
    """One probe outcome. ``ok`` false always comes with an ``error_class``; ``degraded`` is
    the reason a success crossed a threshold (latency, certificate expiry), else None."""

    ok: bool
    latency_ms: float
    error_class: str | None = None
    error: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    degraded: str | None = None

    def __post_init__(self) -> None:
        if self.ok and self.error_class is not None:
            raise ValueError("a successful result carries no error_class")
        if not self.ok and self.error_class not in ERROR_CLASSES:
            raise ValueError(
                f"error_class must be one of {sorted(ERROR_CLASSES)}, got {self.error_class!r}"
            )
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.degraded is not None and not self.ok:
            raise ValueError("only a successful result is degraded (a failure is down)")

    @property
    def status(self) -> str:
        """``up``, ``timeout`` or ``down``: what a dashboard shows."""
        if self.ok:
            return "up"
        return "timeout" if self.error_class == "timeout" else "down"

    @property
    def timed_out(self) -> bool:
        return self.error_class == "timeout"

    @classmethod
    def up(cls, latency_ms: float, *, degraded: str | None = None, **detail: Any) -> ProbeResult:
        return cls(True, latency_ms, detail=detail, degraded=degraded)

    @classmethod
    def down(cls, error_class: str, error: str, latency_ms: float, **detail: Any) -> ProbeResult:
        return cls(False, latency_ms, error_class, error, detail)


@dataclass(frozen=True)
class ProbeContext:
    """What a probe may know about its run besides its config.

    ``timeout_s`` is the run's soft limit: the probe must return by then (the threads pool
    cannot interrupt it). ``deadline`` is that limit as a budget started with the run (the
    runner sets it): give each blocking step ``deadline.bound(per_op)``. ``policy`` is what the
    target guard allows; a custom kind that opens connections itself should use
    :func:`workers.target_guard.connect_vetted` with it (and ``deadline=context.deadline``).
    """

    timeout_s: float
    policy: AddressPolicy = field(default_factory=AddressPolicy)
    region: str = ""
    deadline: Deadline | None = field(default=None, compare=False)
    #: A CA bundle (PEM) the http probe trusts besides the public ones (internal CAs).
    tls_ca_file: str | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def run_deadline(self) -> Deadline:
        """The run's budget: the runner's :attr:`deadline`, else ``timeout_s`` from now."""
        return self.deadline if self.deadline is not None else Deadline(self.timeout_s)
