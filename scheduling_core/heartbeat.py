"""When a heartbeat check is late: the deadline of its next success ping.

A heartbeat check's signal comes from the job it watches (a ping), not from a probe. Its job
waits in the due index at the instant silence becomes an alert; a success ping moves it on, and
a deadline that passes with no ping is a failed run, after which the next one is one period
later (so each missed period counts once towards the failure threshold).

Two schedules: every ``period`` (a ping is due ``period`` after the last one), or a cron spec
in a timezone (a ping is due after each firing). ``grace`` is added to each expected instant.
A run that sent its start ping and no success within ``max_duration`` is late at start +
``max_duration``, if that comes first. ``expected_duration`` (at most ``max_duration``) marks a
slower band: a run still going at start + ``expected_duration`` is late there too, but that
lateness (and a success whose run took longer) points to degraded, not down
(:meth:`HeartbeatSchedule.overran`).
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
    after each expected instant; ``max_duration`` from a start ping (None: not watched);
    ``expected_duration`` from a start ping, the degraded band before it (None: none)."""

    grace: timedelta
    every: timedelta | None = None
    cron: Schedule | None = None
    timezone: str = "UTC"
    max_duration: timedelta | None = None
    expected_duration: timedelta | None = None

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
        for limit in (self.expected_duration, self.max_duration):
            if limit is not None:
                current = min(current, started + limit)
        return current

    def overran(self, duration: timedelta | None) -> bool:
        """Whether a run that took ``duration`` (None: unknown) took longer than expected."""
        return (
            duration is not None
            and self.expected_duration is not None
            and duration > self.expected_duration
        )

    def is_expected_overrun(self, missed: datetime, started: datetime | None) -> bool:
        """Whether the deadline ``missed`` was the expected end of the run started at
        ``started`` (start + ``expected_duration``), not the success deadline or the
        ``max_duration``: that lateness is degraded. Compared to the millisecond, as both were
        written with the start ping."""
        if started is None or self.expected_duration is None:
            return False
        return abs((missed - (started + self.expected_duration)).total_seconds()) < 0.01

    def deadline_after_overrun(self, missed: datetime, started: datetime) -> datetime:
        """The deadline after the run started at ``started`` went past its expected duration
        (at ``missed``) and is still running: the next miss's, or start + ``max_duration``
        if that comes first."""
        after = self.deadline_after_miss(missed)
        if self.max_duration is not None and started + self.max_duration > missed:
            after = min(after, started + self.max_duration)
        return after

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
    expected = config.get("expected_duration")
    return HeartbeatSchedule(
        grace=timedelta(seconds=float(config.get("grace", 0))),
        every=None if cron else timedelta(seconds=period_s),
        cron=parse(cron) if cron else None,
        timezone=str(config.get("timezone") or "UTC"),
        max_duration=timedelta(seconds=float(max_duration)) if max_duration else None,
        expected_duration=timedelta(seconds=float(expected)) if expected else None,
    )
