"""Fast regressions for what the outage scenarios found: windows lost to an outage stay visible
to ``schedule diagnose`` after the outage, even once later windows fire.

1. A window whose publish failed: the failing entry is cleared by the next success, so the
   window is also a gap record.
2. Windows that passed their grace while beat could not tick (Redis down): recorded before the
   same tick fires the current window (which moves ``last_window`` past them).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.cron import T0, end_runs, make_engine

from celery_app.cron_tasks.registration import cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.findings import FindingKind

pytestmark = pytest.mark.faults

MIN = timedelta(minutes=1)


def _noop() -> None: ...


def _task(app, task_id: str) -> None:
    cron("* * * * *", app=app, id=task_id, name=f"records.{task_id}")(_noop)


def test_a_window_lost_to_a_broker_outage_stays_in_diagnose_after_recovery(cron_app, r):
    _task(cron_app, "fragile")
    engine = make_engine(cron_app)
    real_sender = engine.sender

    class BrokerDown:
        def publish(self, requests, *, manual=False):
            raise ConnectionError("broker unreachable")

    engine.sender = BrokerDown()
    engine.tick(T0 + timedelta(seconds=1))
    engine.sender = real_sender
    end_runs(r)
    assert engine.tick(T0 + MIN + timedelta(seconds=1)).fired  # the broker is back
    findings = CronService(cron_app, clock=lambda: T0 + 2 * MIN).diagnose()
    lost = [f for f in findings if f.kind == FindingKind.NOT_FIRED and f.subject == "fragile"]
    assert [f.since for f in lost] == [T0], findings
    assert window_id(T0) in lost[0].message and "broker unreachable" in lost[0].message


def test_windows_missed_while_beat_could_not_tick_are_reported_although_it_fires_now(cron_app, r):
    _task(cron_app, "steady")
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired
    end_runs(r)
    # Redis was down from 00:00:30 to 00:05:10: 00:01 .. 00:03 passed their grace (60 s).
    report = engine.tick(T0 + 5 * MIN + timedelta(seconds=10))
    assert [f.window for f in report.fired] == [T0 + 5 * MIN]
    findings = CronService(cron_app, clock=lambda: T0 + 6 * MIN).diagnose()
    gaps = [f for f in findings if f.kind == FindingKind.NOT_FIRED and f.subject == "steady"]
    assert [f.since for f in gaps] == [T0 + MIN], findings
    assert window_id(T0 + MIN) in gaps[0].message
    # recording is idempotent: a tick that retries the same windows adds no second record
    before = len(engine.store.gaps())
    engine.store.record_gaps([(engine.tasks[0], T0 + MIN, T0 + 4 * MIN)], T0 + 6 * MIN, "again")
    assert len(engine.store.gaps()) == before
