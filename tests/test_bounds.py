"""Every number a user writes into a check or a bucket is bounded at write time, the error names
the field and the allowed range, nothing is written; the date arithmetic saturates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support.checks import at
from support.state_db import snapshot

from celery_app.checks.jobs import from_unix, read_job, to_unix
from celery_app.checks.ratelimit import get_rate_limit, set_rate_limit
from celery_app.checks.store import CheckStore
from celery_app.errors import CheckFieldError
from celery_app.settings import load_settings
from scheduling_core import Params, PostExecInput, next_aligned
from scheduling_core._instant import EARLIEST, LATEST

NOW = at(1_780_000_000)
HUGE = 10**400


BAD_NUMBERS = [
    # (field, value, what the message states)
    ("period", 0, ">= 1 and <= 2,678,400 seconds (31 days)"),
    ("period", 31 * 86_400 + 1, "<= 2,678,400 seconds (31 days)"),
    ("period", 10**14, "<= 2,678,400"),
    ("period", 1e14, "<= 2,678,400"),
    ("period", float("inf"), "<= 2,678,400"),
    ("period", float("nan"), "<= 2,678,400"),
    ("period", HUGE, "an integer of about 401 digits"),
    ("period", "1" * 5000, "<= 2,678,400"),
    ("plan_weight", 10**11, ">= 0 and <= 1,000,000"),
    ("plan_weight", 1e11, "<= 1,000,000"),
    ("plan_weight", 1_000_001, "<= 1,000,000"),
    ("plan_weight", HUGE, "<= 1,000,000"),
    ("plan_weight", -1, ">= 0"),
    ("region_spread", HUGE, "number of seconds"),
    ("region_spread", float("inf"), "0 <= region_spread < period (60)"),
    ("region_spread", 60, "0 <= region_spread < period (60)"),
    ("config", {"timeout": float("inf")}, "JSON"),
    ("config", {"timeout": 3, "limit": float("nan")}, "JSON"),
]


@pytest.mark.parametrize(("field", "value", "allowed"), BAD_NUMBERS)
def test_a_number_out_of_range_names_the_field_and_range_and_writes_nothing(
    store, r, field, value, allowed
):
    store.create(now=NOW, uid="keep", tenant="acme", kind="testprobe", target="x", period=60)
    before = snapshot(r)
    raw = {"uid": "c1", "tenant": "acme", "kind": "testprobe", "target": "x", "period": 60}
    for write in (
        lambda: store.create(now=NOW, **(raw | {field: value})),
        lambda: store.update("keep", now=NOW, **{field: value}),
    ):
        with pytest.raises(CheckFieldError) as caught:
            write()
        # the field, or the place inside it (``config.timeout``)
        named = caught.value.field
        assert named == field or named.startswith(f"{field}.")
        assert str(caught.value).startswith(f"{named}: ")
        assert allowed in str(caught.value)
    assert snapshot(r) == before


def test_the_largest_allowed_numbers_are_accepted_and_schedule(store, r, keys):
    defn = store.create(
        now=NOW, uid="c1", tenant="acme", kind="testprobe", target="x",
        period=31 * 86_400, plan_weight=1_000_000, region_spread=31 * 86_400 - 1,
        regions=["eu", "us"],
    )  # fmt: skip
    for jid in defn.job_ids():
        job = read_job(r, keys, jid)
        assert job is not None
        assert NOW.timestamp() < job.scheduled_at <= NOW.timestamp() + 31 * 86_400


def test_cli_update_of_a_huge_plan_weight_is_refused_and_writes_nothing(cli, store, r):
    store.create(now=NOW, uid="web", tenant="acme", kind="testprobe", target="x", period=60)
    before = snapshot(r)
    out = cli("update", "web", "--plan-weight", "100000000000", ok=False)
    assert "plan_weight: must be an integer >= 0 and <= 1,000,000" in out
    out = cli("update", "web", "--period", "100000000000000", ok=False)
    assert "period: must be an integer >= 1 and <= 2,678,400" in out
    assert "region_spread:" in cli("update", "web", "--region-spread", "inf", ok=False)
    assert snapshot(r) == before


def test_a_weight_change_alone_recomputes_the_effective_deadline(r, keys, settings, test_kind):
    params = Params(tier_credit_per_weight=timedelta(seconds=1))
    store = CheckStore(r, keys, settings, params)
    defn = store.create(now=NOW, uid="c1", tenant="acme", kind="testprobe", target="x",
                        period=60, regions=["eu"])  # fmt: skip
    jid = defn.job_ids()[0]
    placed = read_job(r, keys, jid)
    assert placed is not None and placed.effective_scheduled_at == placed.scheduled_at
    store.update("c1", now=NOW + timedelta(seconds=5), plan_weight=10)
    reweighed = read_job(r, keys, jid)
    assert reweighed is not None
    assert reweighed.scheduled_at == placed.scheduled_at  # the tick is not re-anchored
    assert reweighed.effective_scheduled_at == pytest.approx(placed.scheduled_at - 10)
    store.update("c1", now=NOW + timedelta(seconds=6), plan_weight=0)
    back = read_job(r, keys, jid)
    assert back is not None and back.effective_scheduled_at == placed.scheduled_at


# --- rate limits -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--per-minute", "20", "--burst", "0"], "burst: must be a number >= 1 and <= 1,000,000"),
        (["--per-minute", "20", "--burst", "0.5"], "burst: must be a number >= 1"),
        (["--per-minute", "20", "--burst", "nan"], "burst: must be a number >= 1"),
        (["--per-minute", "20", "--burst", "1e7"], "burst: must be a number >= 1"),
        (["--per-minute", "0"], "per_minute: must be a number > 0 and <= 1,000,000"),
        (["--per-minute", "-1"], "per_minute: must be a number > 0"),
        (["--per-minute", "nan"], "per_minute: must be a number > 0"),
        (["--per-minute", "inf"], "per_minute: must be a number > 0"),
        (["--per-minute", "1e400"], "per_minute: must be a number > 0"),
        (["--per-minute", "2000000"], "per_minute: must be a number > 0 and <= 1,000,000"),
    ],
)
def test_bad_rate_limits_name_the_option_and_write_nothing(cli, r, keys, args, message):
    assert message in cli("ratelimit", "acme", *args, ok=False)
    assert r.dbsize() == 0


def test_a_fractional_rate_gets_a_one_token_bucket(cli, r, keys):
    assert "acme: 0.5/min, burst 1" in cli("ratelimit", "acme", "--per-minute", "0.5")
    bucket = get_rate_limit(r, keys, "acme")
    assert bucket is not None and (bucket.per_minute, bucket.burst) == (0.5, 1.0)
    out = cli("ratelimit", "acme", "--per-minute", "30")
    assert "acme: 30/min, burst 30" in out  # the default burst: one minute of runs


def test_a_bucket_for_a_bad_tenant_is_refused(r, keys):
    for tenant in ("acme\n", "a b", "a\x1bb", "a:b"):
        with pytest.raises(CheckFieldError) as caught:
            set_rate_limit(r, keys, tenant, per_minute=5, burst=5)
        assert caught.value.field == "tenant"
    for value in (True, HUGE, "5"):
        with pytest.raises(CheckFieldError) as caught:
            set_rate_limit(r, keys, "acme", per_minute=value, burst=5)
        assert caught.value.field == "per_minute"
    assert r.dbsize() == 0


# --- saturating date arithmetic ----------------------------------------------------------


@pytest.mark.parametrize("weight", [10**11, 10**18, HUGE])
def test_a_huge_tier_credit_saturates_at_the_earliest_instant(weight):
    params = Params(tier_credit_per_weight=timedelta(seconds=1))
    deadline = params.effective_scheduled_at(NOW, 0.0, weight)
    assert deadline == EARLIEST
    assert from_unix(to_unix(deadline)) == deadline  # storable as a Unix score and back
    state = params.post_exec(
        PostExecInput(
            prev_cost_ewma_ms=10.0, prev_delay_ewma_ms=0.0, prev_lane=0, plan_weight=weight,
            scheduled_at=NOW, effective_scheduled_at=EARLIEST, duration_ms=20.0,
            timed_out=False, exec_start=NOW, next_scheduled_at=NOW + timedelta(seconds=60),
        )
    )  # fmt: skip
    assert state.effective_scheduled_at == EARLIEST


def test_a_capped_credit_is_still_exact():
    params = Params(
        tier_credit_per_weight=timedelta(seconds=1), tier_credit_max=timedelta(seconds=30)
    )
    assert params.effective_scheduled_at(NOW, 0.0, HUGE) == NOW - timedelta(seconds=30)
    assert params.effective_scheduled_at(NOW, 0.0, 7) == NOW - timedelta(seconds=7)


def test_next_aligned_with_huge_periods_and_spreads_does_not_overflow():
    biggest = timedelta(days=999_999_999)
    got = next_aligned(NOW, biggest, biggest, "c1", "us", ["eu", "us"], biggest)
    assert NOW < got <= LATEST
    year = timedelta(days=365)
    got = next_aligned(NOW, year, year, "c1", "us", ["eu", "us"], timedelta.max)
    assert NOW < got <= NOW + year
    assert next_aligned(NOW, -year, biggest, "c1", None, [], timedelta(0)) == LATEST
    near_end = datetime(9999, 12, 1, tzinfo=UTC)
    assert next_aligned(near_end, year, year, "c1", None, [], timedelta(0)) == LATEST


def test_saturated_instants_convert_to_any_timezone():
    from zoneinfo import ZoneInfo

    for zone in ("Pacific/Kiritimati", "Pacific/Pago_Pago"):
        start = NOW.astimezone(ZoneInfo(zone))
        early = Params(tier_credit_per_weight=timedelta(hours=1)).effective_scheduled_at(
            start, 0.0, HUGE
        )
        assert early == EARLIEST and early.tzinfo is start.tzinfo


def test_settings_bounds_keep_the_worst_case_credit_inside_the_calendar():
    worst = load_settings(tier_credit_per_weight=3600, tier_credit_max=0)
    params = Params.from_settings(worst)
    deadline = params.effective_scheduled_at(NOW, 0.0, 1_000_000)
    assert EARLIEST < deadline < NOW  # a million hours back: 1912, no saturation needed


def test_a_stored_pre_bounds_weight_no_longer_stops_dispatching_for_everyone(
    r, keys, settings, test_kind, broker
):
    """The issue's incident: a job hash holding w=1e11 (written before the bound existed) with
    tier credit on made every tick raise OverflowError before it claimed anything."""
    from support.checks import register_fake_worker
    from support.completion import finish

    from celery_app.checks.dispatch import Dispatcher
    from celery_app.checks.run_contract import RunRecord, RunStatus
    from celery_app.factory import create_app

    credit_on = settings.model_copy(update={"tier_credit_per_weight": timedelta(seconds=1)})
    app = create_app(credit_on)
    store = CheckStore(r, keys, credit_on)
    t0 = 1_780_000_000.0
    for uid, tenant in (("huge", "acme"), ("other", "globex")):
        store.create(now=at(t0), uid=uid, tenant=tenant, kind="testprobe", target="x",
                     period=60, regions=["eu"])  # fmt: skip
    r.hset(keys.job("huge@eu"), "w", str(10**11))  # around the validation, as old data
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10, ttl=None)
    dispatcher = Dispatcher(app, client=r)
    ran: set[str] = set()
    now = t0
    while now < t0 + 130:
        for claim in dispatcher.tick(now).claims:
            assert finish(
                r, keys, credit_on, claim.job_id, claim.lease_token, duration_ms=20.0,
                exec_start=at(now), now=at(now + 0.05),
                record=RunRecord(RunStatus.UP, "eu", finished_at=now + 0.05),
            )[0]  # fmt: skip
            ran.add(claim.job_id)
        now += 1.0
    assert ran == {"huge@eu", "other@eu"}
    huge = read_job(r, keys, "huge@eu")
    assert huge is not None and huge.runs >= 2
    assert huge.effective_scheduled_at == to_unix(EARLIEST)  # saturated: sorts first
