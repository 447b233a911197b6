"""Run-now fires through cron_tasks.firing like the engine: a failed publish is recorded, once."""

from __future__ import annotations

from datetime import timedelta

from support.cron import T0

from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.factory import create_app
from celery_app.findings import FindingKind
from celery_app.local.embedded_redis import free_port
from celery_app.redis.schema import CronGapField, CronOutcome, CronStateField, Keys
from celery_app.settings import load_settings

KEYS = Keys("cbtest")


def _noop() -> None: ...


def test_run_now_on_a_dead_broker_is_recorded_and_not_retried(r):
    # a real broker URL nothing listens on: the publish fails, the state Redis is fine
    app = create_app(load_settings(broker_url=f"redis://127.0.0.1:{free_port()}/0"))
    cron("0 3 * * *", app=app, id="nightly", name="firing.nightly")(_noop)
    now = T0 + timedelta(seconds=20)
    service = CronService(app, clock=lambda: now)

    result = service.run_now("nightly")

    assert not result.sent
    assert result.message.startswith("not sent: publish failed: ConnectionError")
    assert "not retried" in result.message
    state = r.hgetall(KEYS.cron_state("nightly", GLOBAL_TENANT))
    assert state[CronStateField.OUTCOME] == CronOutcome.SEND_FAILED
    assert state[CronStateField.MANUAL] == "1"
    assert r.exists(KEYS.cron_inflight("nightly", GLOBAL_TENANT)) == 0
    assert r.hlen(KEYS.cron_pending()) == 0  # recorded, so no longer pending
    (gap,) = service.store.gaps()
    assert (gap[CronGapField.TASK], gap[CronGapField.FROM]) == ("nightly", T0.timestamp())
    (gap,) = [f for f in service.diagnose() if f.kind == FindingKind.NOT_FIRED]
    assert (gap.subject, gap.since) == ("nightly", T0)
    assert "publish failed" in gap.message
    # the window stays consumed: a second run-now in it is refused, not sent twice
    again = service.run_now("nightly")
    assert not again.sent
    assert f"window {window_id(T0)} of 'nightly' was already fired by manual:" in again.message
