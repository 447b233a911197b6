"""The wall clock beat and the CLI read, with a test-only accelerated variant.

Why: a process test of beat (several beats, one killed mid-window) would otherwise wait real
minutes. ``CHECKBEAT_TEST_CLOCK="<start ISO>@<real epoch>@<rate>"`` makes ``now()`` return
``start + (time.time() - epoch) * rate``, so every process given the same value agrees on the
simulated time, and beat divides its sleeps by ``rate``. It is for tests only: production never
sets it, and when it is unset the clock is ``datetime.now(UTC)``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

TEST_CLOCK_ENV = "CHECKBEAT_TEST_CLOCK"


@dataclass(frozen=True)
class Clock:
    start: datetime | None = None
    epoch: float = 0.0
    rate: float = 1.0

    def now(self) -> datetime:
        if self.start is None:
            return datetime.now(UTC)
        return self.start + timedelta(seconds=(time.time() - self.epoch) * self.rate)

    def steady(self) -> float:
        """Monotonic seconds at the clock's rate: what a clock-step check compares ``now()``
        with (a stall advances both alike)."""
        return time.monotonic() * self.rate

    def real_seconds(self, simulated: float) -> float:
        return simulated / self.rate

    def encode(self) -> str:
        assert self.start is not None
        return f"{self.start.isoformat()}@{self.epoch}@{self.rate}"


def clock_from_env(environ: Mapping[str, str] | None = None) -> Clock:
    raw = (environ if environ is not None else os.environ).get(TEST_CLOCK_ENV, "").strip()
    if not raw:
        return Clock()
    try:
        start_text, epoch_text, rate_text = raw.split("@")
        start = datetime.fromisoformat(start_text)
        if start.tzinfo is None:
            raise ValueError("start must carry a timezone")
        rate = float(rate_text)
        if rate <= 0:
            raise ValueError("rate must be > 0")
        return Clock(start.astimezone(UTC), float(epoch_text), rate)
    except ValueError as exc:
        raise ValueError(
            f"{TEST_CLOCK_ENV}={raw!r}: expected '<aware ISO start>@<unix epoch>@<rate>' ({exc})"
        ) from None
