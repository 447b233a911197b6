"""When a heartbeat check is late: the deadline of its next success ping.

A heartbeat check's signal comes from the job it watches (a ping), not from a probe. Its job
waits in the due index at the instant silence becomes an alert; a success ping moves it on, and
a deadline that passes with no ping is a failed run, after which the next one is one period
later (so each missed period counts once towards the failure threshold).

Two schedules: every ``period`` (a ping is due ``period`` after the last one), or a cron spec
in a timezone (a ping is due after each firing). ``grace`` is added to each expected instant.
A run that sent its start ping and no success within ``max_duration`` is late at start +
``max_duration``, if that comes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from scheduling_core.cron import Schedule


@dataclass(frozen=True)
class HeartbeatSchedule:
    """When pings are expected: ``every`` (a period) or ``cron`` in ``timezone``; ``grace``
    after each expected instant; ``max_duration`` from a start ping (None: not watched)."""

    grace: timedelta
    every: timedelta | None = None
    cron: Schedule | None = None
    timezone: str = "UTC"
    max_duration: timedelta | None = None

    def expected_after(self, t: datetime) -> datetime:
        """The next instant a success ping is expected after one at ``t`` (without grace)."""
        if self.cron is not None:
            fire = self.cron.next_after(t.astimezone(ZoneInfo(self.timezone)))
            if fire is None:
                raise ValueError(f"cron spec {self.cron.spec!r} never fires after {t}")
            return fire.astimezone(t.tzinfo)
        assert self.every is not None
        return t + self.every

    def deadline_after_success(self, at: datetime) -> datetime:
        """The deadline of the next success ping after a success (or fail) ping at ``at``."""
        return self.expected_after(at) + self.grace

    def deadline_after_start(self, started: datetime, current: datetime) -> datetime:
        """The deadline once a start ping came at ``started``: ``current`` unless the run is
        watched for its duration and would overrun first."""
        if self.max_duration is None:
            return current
        return min(current, started + self.max_duration)

    def deadline_after_miss(self, missed: datetime) -> datetime:
        """The deadline after the one at ``missed`` passed with no ping: one expected instant
        later (each missed period is one failed run)."""
        return self.expected_after(missed - self.grace) + self.grace


def heartbeat_schedule(period_s: int, config: Mapping[str, Any]) -> HeartbeatSchedule:
    """The schedule a validated heartbeat config says (``celery_app.checks.heartbeat_kind``):
    its ``cron`` (with ``timezone``) if it has one, else every ``period_s``."""
    from scheduling_core.cron import parse

    cron = config.get("cron")
    max_duration = config.get("max_duration")
    return HeartbeatSchedule(
        grace=timedelta(seconds=float(config.get("grace", 0))),
        every=None if cron else timedelta(seconds=period_s),
        cron=parse(cron) if cron else None,
        timezone=str(config.get("timezone") or "UTC"),
        max_duration=timedelta(seconds=float(max_duration)) if max_duration else None,
    )
