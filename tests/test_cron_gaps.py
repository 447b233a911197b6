"""Every window a stall costs is reported: one range record per task (per tenant), once."""

from __future__ import annotations

from datetime import timedelta

from support.cron import T0, end_runs, make_engine, store_of

from celery_app.cron_tasks.cron_state import Gap
from celery_app.cron_tasks.registration import cron, cron_tasks, window_id
from celery_app.cron_tasks.service import CronService
from celery_app.cron_tasks.tenants_provider import tenants_provider
from celery_app.findings import FindingKind
from celery_app.redis.schema import CronGapField, Keys

MIN = timedelta(minutes=1)
KEYS = Keys("cbtest")


def _noop(tenant: str | None = None) -> None: ...


def _declare(app, task_id, spec="* * * * *", **options):
    return cron(spec, app=app, id=task_id, name=f"t.{task_id}", **options)(_noop)


def _by_task(gaps):
    return {(g[CronGapField.TASK], g.get(CronGapField.TENANT)): g for g in gaps}


def test_one_hour_stall_records_every_missed_window_as_one_range(cron_app, r):
    _declare(cron_app, "minutely")
    _declare(cron_app, "five", spec="*/5 * * * *")
    _declare(cron_app, "per-tenant", per_tenant=True)
    r.sadd(KEYS.tenants(), "acme", "globex")
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired
    end_runs(r)
    # The engine wakes an hour late: 00:01 .. 00:58 passed their grace (60 s); 00:59 has not,
    # but 01:00 is due too and only the newest fires, so 00:59 is part of the gap.
    report = engine.tick(T0 + 60 * MIN + timedelta(seconds=10))
    assert {f.window for f in report.fired} == {T0 + 60 * MIN}
    gaps = _by_task(store_of(cron_app).gaps())
    assert set(gaps) == {
        ("minutely", None),
        ("five", None),
        ("per-tenant", "acme"),
        ("per-tenant", "globex"),
    }
    minutely = gaps[("minutely", None)]
    assert (minutely[CronGapField.FROM], minutely[CronGapField.TO]) == (
        (T0 + MIN).timestamp(),
        (T0 + 60 * MIN).timestamp(),
    )
    assert minutely[CronGapField.COUNT] == 59
    five = gaps[("five", None)]
    assert (five[CronGapField.FROM], five[CronGapField.TO], five[CronGapField.COUNT]) == (
        (T0 + 5 * MIN).timestamp(),
        (T0 + 56 * MIN).timestamp(),
        11,  # 00:05 .. 00:55
    )
    assert gaps[("per-tenant", "globex")][CronGapField.COUNT] == 59
    findings = CronService(cron_app, clock=lambda: T0 + 61 * MIN).diagnose()
    gaps = {f.subject: f for f in findings if f.kind == FindingKind.NOT_FIRED}
    assert gaps["minutely"].since == gaps["per-tenant|acme"].since == T0 + MIN, findings
    assert (
        f"task 'minutely': windows from {window_id(T0 + MIN)} to before "
        f"{window_id(T0 + 60 * MIN)} (59 windows) were not fired"
    ) in gaps["minutely"].message
    assert "'per-tenant' (tenant acme)" in gaps["per-tenant|acme"].message
    assert "(59 windows)" in gaps["per-tenant|acme"].message
    # A second engine stalled just as long finds the same windows: nothing is recorded twice.
    other = make_engine(cron_app, owner="engine-2")
    other.tick(T0 + 60 * MIN + timedelta(seconds=20))
    assert len(store_of(cron_app).gaps()) == 4


def test_overlapping_range_keeps_only_its_new_windows(cron_app):
    _declare(cron_app, "minutely")
    task = cron_tasks(cron_app)["minutely"]
    store = store_of(cron_app)
    now = T0 + 70 * MIN
    assert store.record_gaps([Gap(task, T0 + MIN, T0 + 59 * MIN, 58, 60.0)], now, "a") == 1
    assert store.record_gaps([Gap(task, T0 + MIN, T0 + 61 * MIN, 60, 60.0)], now, "b") == 1
    assert store.record_gaps([Gap(task, T0 + MIN, T0 + 61 * MIN, 60, 60.0)], now, "c") == 0
    newest, first = store.gaps()
    assert (newest[CronGapField.FROM], newest[CronGapField.COUNT]) == (
        (T0 + 59 * MIN).timestamp(),
        2,
    )
    assert first[CronGapField.COUNT] == 58


def test_unreadable_provider_records_per_tenant_gaps_as_star_with_a_note(cron_app, r):
    _declare(cron_app, "per-tenant", per_tenant=True)
    down = []

    def provider():
        if down:
            raise RuntimeError("tenant db down")
        return ["acme"]

    tenants_provider(provider, app=cron_app)
    engine = make_engine(cron_app)
    assert engine.tick(T0 + timedelta(seconds=1)).fired
    end_runs(r)
    down.append(True)
    engine.tick(T0 + 10 * MIN + timedelta(seconds=10))
    (gap,) = store_of(cron_app).gaps()
    assert gap[CronGapField.TENANT] == "*"
    assert "provider failed: tenant db down" in gap[CronGapField.NOTE]
    assert gap[CronGapField.COUNT] == 9  # 00:01 .. 00:08 missed, 00:09 superseded by 00:10
