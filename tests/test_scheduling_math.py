"""Unit tests for scheduling_core's math: every documented edge of every function."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import subprocess
import sys
import types
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import scheduling_core as sc
from scheduling_core import (
    COST_OFFSET_WEIGHT,
    DEFAULT_EXECUTION_TIMEOUT,
    EWMA_ALPHA,
    LANE_FAST,
    LANE_SLOW,
    MAX_DEPRIORITIZE_OFFSET,
    Params,
    PostExecInput,
    PostExecState,
    classify_lane,
    delay_sample_ms,
    jitter_for,
    next_aligned,
    region_index,
    region_spread,
    update_ewma,
)

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 29, 18, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)
PARIS = ZoneInfo("Europe/Paris")
# 2026-03-29 01:00 UTC: Paris jumps from 02:00 CET to 03:00 CEST.
BEFORE_SPRING = datetime(2026, 3, 29, 1, 30, tzinfo=PARIS)  # 00:30 UTC
AFTER_SPRING = datetime(2026, 3, 29, 3, 30, tzinfo=PARIS)  # 01:30 UTC, one hour later


def unix_second(t: datetime) -> int:
    return (t.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // S


# --- public surface -----------------------------------------------------------------------

EXPECTED_PUBLIC = {
    "LANE_FAST",
    "LANE_SLOW",
    "COST_OFFSET_WEIGHT",
    "DEFAULT_EXECUTION_TIMEOUT",
    "EWMA_ALPHA",
    "MAX_DEPRIORITIZE_OFFSET",
    "update_ewma",
    "classify_lane",
    "delay_sample_ms",
    "jitter_for",
    "first_aligned",
    "next_aligned",
    "region_index",
    "region_spread",
    "Params",
    "PostExecInput",
    "PostExecState",
    "parse",
    "Schedule",
    "CronError",
}


def test_all_lists_exactly_the_public_names() -> None:
    assert set(sc.__all__) == EXPECTED_PUBLIC
    assert len(sc.__all__) == len(EXPECTED_PUBLIC)
    for name in sc.__all__:
        assert hasattr(sc, name), name


def test_package_namespace_has_no_other_public_values() -> None:
    public = {
        name
        for name, value in vars(sc).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == EXPECTED_PUBLIC


def test_constants() -> None:
    assert (LANE_FAST, LANE_SLOW) == (0, 1)
    assert COST_OFFSET_WEIGHT == 2
    assert timedelta(seconds=15) == DEFAULT_EXECUTION_TIMEOUT
    assert EWMA_ALPHA == 0.3
    assert timedelta(seconds=30) == MAX_DEPRIORITIZE_OFFSET
    assert MAX_DEPRIORITIZE_OFFSET == COST_OFFSET_WEIGHT * DEFAULT_EXECUTION_TIMEOUT


def test_import_pulls_in_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import scheduling_core\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "banned = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'celery', 'redis', 'kombu'})\n"
        "foreign = sorted(new - set(sys.stdlib_module_names) - {'scheduling_core'})\n"
        "print(repr((banned, foreign)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "([], [])", out.stdout + out.stderr


# --- update_ewma ---------------------------------------------------------------------------


@pytest.mark.parametrize("prev", [0.0, -5.0, math.nan])
def test_update_ewma_first_sample_seeds(prev: float) -> None:
    assert update_ewma(prev, 480.0) == 480.0


def test_update_ewma_folds_with_alpha() -> None:
    assert update_ewma(100.0, 200.0) == pytest.approx(0.3 * 200.0 + 0.7 * 100.0)
    assert update_ewma(100.0, 200.0) == pytest.approx(130.0)


def test_update_ewma_floors_negative_samples() -> None:
    assert update_ewma(100.0, -50.0) == pytest.approx(70.0)
    assert update_ewma(0.0, -50.0) == 0.0


def test_update_ewma_treats_nan_sample_as_zero() -> None:
    assert update_ewma(100.0, math.nan) == pytest.approx(70.0)
    assert update_ewma(0.0, math.nan) == 0.0


def test_update_ewma_tracks_a_sustained_change() -> None:
    value = 100.0
    for _ in range(20):
        value = update_ewma(value, 1000.0)
    assert 990.0 < value < 1000.0


# --- delay_sample_ms -----------------------------------------------------------------------


def test_delay_sample_on_time_is_zero() -> None:
    assert delay_sample_ms(T0, None, T0) == 0.0


def test_delay_sample_late_start_in_ms() -> None:
    assert delay_sample_ms(T0, None, T0 + timedelta(milliseconds=1500, microseconds=250)) == (
        1500.25
    )


def test_delay_sample_early_start_floors_at_zero() -> None:
    assert delay_sample_ms(T0, None, T0 - timedelta(seconds=3)) == 0.0


def test_delay_sample_prefers_scheduled_at_over_effective() -> None:
    effective = T0 - timedelta(seconds=10)
    assert delay_sample_ms(T0, effective, T0 + 2 * S) == 2000.0


def test_delay_sample_falls_back_to_effective() -> None:
    effective = T0 - timedelta(seconds=10)
    assert delay_sample_ms(None, effective, T0 + 2 * S) == 12000.0


def test_delay_sample_without_any_reference_is_zero() -> None:
    assert delay_sample_ms(None, None, T0 + timedelta(hours=5)) == 0.0


def test_delay_sample_measures_elapsed_time_across_dst() -> None:
    # Same tzinfo on both sides: plain subtraction would say 2 h (wall clock); 1 h elapsed.
    assert delay_sample_ms(BEFORE_SPRING, None, AFTER_SPRING) == 3_600_000.0


def test_delay_sample_mixed_zones() -> None:
    start = (T0 + 5 * S).astimezone(timezone(timedelta(hours=-7)))
    assert delay_sample_ms(T0, None, start) == 5000.0


@pytest.mark.parametrize(
    ("scheduled", "effective", "start", "name"),
    [
        (T0, None, datetime(2026, 1, 1), "exec_start"),
        (datetime(2026, 1, 1), None, T0, "scheduled_at"),
        (None, datetime(2026, 1, 1), T0, "effective_scheduled_at"),
        (T0, datetime(2026, 1, 1), T0, "effective_scheduled_at"),
    ],
)
def test_delay_sample_rejects_naive(
    scheduled: datetime | None, effective: datetime | None, start: datetime, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        delay_sample_ms(scheduled, effective, start)


# --- classify_lane -------------------------------------------------------------------------

LANES_ON = Params(lane_slow_threshold_ms=2000.0, lane_fast_threshold_ms=500.0)


@pytest.mark.parametrize("slow", [0.0, -1.0])
@pytest.mark.parametrize("prev", [LANE_FAST, LANE_SLOW])
@pytest.mark.parametrize("cost", [0.0, 10.0, 1e9])
def test_classify_lane_off_returns_prev_unchanged(slow: float, prev: int, cost: float) -> None:
    params = Params(lane_slow_threshold_ms=slow, lane_fast_threshold_ms=100.0)
    assert classify_lane(prev, cost, params) == prev


@pytest.mark.parametrize("prev", [LANE_FAST, LANE_SLOW])
def test_classify_lane_promotes_at_slow_threshold(prev: int) -> None:
    assert classify_lane(prev, 2000.0, LANES_ON) == LANE_SLOW
    assert classify_lane(prev, 50_000.0, LANES_ON) == LANE_SLOW


@pytest.mark.parametrize("prev", [LANE_FAST, LANE_SLOW])
def test_classify_lane_demotes_below_fast_threshold(prev: int) -> None:
    assert classify_lane(prev, 499.9, LANES_ON) == LANE_FAST


@pytest.mark.parametrize("prev", [LANE_FAST, LANE_SLOW])
@pytest.mark.parametrize("cost", [500.0, 1000.0, 1999.9])
def test_classify_lane_holds_inside_band(prev: int, cost: float) -> None:
    assert classify_lane(prev, cost, LANES_ON) == prev


def test_classify_lane_zero_cost_fresh_job_is_fast() -> None:
    assert classify_lane(LANE_FAST, 0.0, LANES_ON) == LANE_FAST
    assert classify_lane(LANE_SLOW, 0.0, LANES_ON) == LANE_FAST
    # Even without a demote edge a fresh job (stored lane FAST) is never promoted.
    assert classify_lane(LANE_FAST, 0.0, Params(lane_slow_threshold_ms=1.0)) == LANE_FAST


def test_classify_lane_without_demote_edge_holds_slow_at_zero_cost() -> None:
    # Band rule taken literally: with lane_fast_threshold_ms == 0 nothing is "below" it.
    assert classify_lane(LANE_SLOW, 0.0, Params(lane_slow_threshold_ms=1.0)) == LANE_SLOW


# --- jitter_for ----------------------------------------------------------------------------


def test_jitter_is_pinned_to_blake2b_of_the_uid() -> None:
    # Golden values: changing the hash would move every deployed check's phase.
    assert jitter_for("check-1", 60 * S) == 8_188_477 * US
    assert jitter_for("check-1", timedelta(days=1)) == 53_528_188_477 * US
    assert jitter_for("", 60 * S) == 58_269_876 * US
    assert jitter_for("é-ü-✓", 60 * S) == 35_143_520 * US
    raw = int.from_bytes(hashlib.blake2b(b"check-1", digest_size=8).digest(), "big")
    assert jitter_for("check-1", 60 * S) == (raw % 60_000_000) * US


@pytest.mark.parametrize("base", [timedelta(0), -60 * S, -US])
def test_jitter_without_period_is_zero(base: timedelta) -> None:
    assert jitter_for("check-1", base) == timedelta(0)


def test_jitter_is_within_period_and_distinct_per_uid() -> None:
    values = {jitter_for(f"check-{i}", 60 * S) for i in range(100)}
    assert all(timedelta(0) <= v < 60 * S for v in values)
    assert len(values) > 95


def test_jitter_resolution_is_one_microsecond() -> None:
    assert jitter_for("check-1", US) == timedelta(0)
    assert jitter_for("check-1", 7 * US) < 7 * US
    assert any(jitter_for(f"c{i}", S) % MS for i in range(10))


def test_jitter_accepts_any_str_including_lone_surrogates() -> None:
    # Encoded with surrogatepass, so no uid string can make scheduling raise.
    assert timedelta(0) <= jitter_for("\ud800x", 60 * S) < 60 * S
    assert jitter_for("\ud800x", 60 * S) != jitter_for("\ud801x", 60 * S)


def test_jitter_rejects_non_str_uid() -> None:
    with pytest.raises(TypeError, match="check_uid"):
        jitter_for(b"check-1", 60 * S)


# --- region_index / region_spread ------------------------------------------------------------


def test_region_index_uses_sorted_order() -> None:
    regions = ["us-east", "eu-west", "ap-south"]
    assert region_index("ap-south", regions) == 0
    assert region_index("eu-west", regions) == 1
    assert region_index("us-east", regions) == 2
    assert regions == ["us-east", "eu-west", "ap-south"]  # caller's list untouched


def test_region_index_is_order_independent() -> None:
    a = ["b", "c", "a"]
    assert [region_index(r, a) for r in "abc"] == [region_index(r, sorted(a)) for r in "abc"]


@pytest.mark.parametrize(
    ("region", "regions"), [(None, ["a", "b"]), ("a", []), ("zz", ["a", "b"]), (None, [])]
)
def test_region_index_degrades_to_zero(region: str | None, regions: list[str]) -> None:
    assert region_index(region, regions) == 0


def test_region_index_duplicates_take_first_position() -> None:
    assert region_index("b", ["b", "a", "b"]) == 1


def test_region_spread_default_is_even_coverage() -> None:
    assert region_spread(60 * S, 3, None) == 20 * S
    assert region_spread(60 * S, 7, None) == 8_571_428 * US  # floored to the microsecond


@pytest.mark.parametrize(("base", "n"), [(60 * S, 1), (60 * S, 0), (60 * S, -2), (0 * S, 3)])
def test_region_spread_zero_cases(base: timedelta, n: int) -> None:
    assert region_spread(base, n, None) == timedelta(0)
    assert region_spread(-60 * S, 3, None) == timedelta(0)


@pytest.mark.parametrize("override", [timedelta(0), 7 * S, 90 * S, -5 * S])
def test_region_spread_override_is_verbatim(override: timedelta) -> None:
    assert region_spread(60 * S, 3, override) == override
    assert region_spread(60 * S, 1, override) == override
    assert region_spread(timedelta(0), 3, override) == override


# --- next_aligned --------------------------------------------------------------------------


def phase_of(uid: str, base: timedelta, period: timedelta, index: int, spread: timedelta) -> int:
    return ((jitter_for(uid, base) + index * spread) % period) // S


def test_next_aligned_lands_on_phase_and_carries_subsecond() -> None:
    now = T0 + timedelta(microseconds=123_456)
    got = next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0))
    # jitter_for("check-1", 60 s) is 8.188477 s, so the phase is second 8 of each minute.
    assert unix_second(got) % 60 == 8
    assert got - now == 8 * S
    assert got.microsecond == 123_456
    assert got.tzinfo is UTC


def test_next_aligned_inside_aligned_second_waits_full_period() -> None:
    now = T0 + timedelta(seconds=8, microseconds=999_999)
    assert next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0)) == now + 60 * S
    now = T0 + 8 * S
    assert next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0)) == now + 60 * S


def test_first_aligned_is_now_inside_the_aligned_second_and_next_aligned_elsewhere() -> None:
    args = (60 * S, 60 * S, "check-1", None, [], timedelta(0))
    inside = T0 + timedelta(seconds=8, microseconds=999_999)  # the phase's second (8)
    assert sc.first_aligned(inside, *args) == inside  # a new job has not just fired: at once
    assert next_aligned(inside, *args) == inside + 60 * S
    for offset in (0, 7, 9, 59):  # elsewhere the same as next_aligned (1..59 s ahead)
        now = T0 + timedelta(seconds=offset, microseconds=5)
        assert sc.first_aligned(now, *args) == next_aligned(now, *args)


def test_next_aligned_one_second_before_phase() -> None:
    now = T0 + timedelta(seconds=7, microseconds=5)
    assert next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0)) == now + S


def test_next_aligned_just_after_phase_wraps() -> None:
    now = T0 + 9 * S
    assert next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0)) == now + 59 * S


def test_next_aligned_region_phases_step_by_spread() -> None:
    regions = ["us", "eu", "ap"]
    spread = region_spread(60 * S, len(regions), None)
    ticks = {
        r: unix_second(next_aligned(T0, 60 * S, 60 * S, "check-1", r, regions, spread)) % 60
        for r in regions
    }
    assert ticks == {"ap": 8, "eu": 28, "us": 48}


def test_next_aligned_spread_modulo_tolerates_any_value() -> None:
    regions = ["a", "b"]
    for spread, expected in [(70 * S, 18), (-5 * S, 3), (125 * S, 13)]:
        got = next_aligned(T0, 60 * S, 60 * S, "check-1", "b", regions, spread)
        assert unix_second(got) % 60 == expected, spread


def test_next_aligned_job_period_differs_from_base_period() -> None:
    # Jitter comes from base_period (8.188477 s); alignment is modulo job_period.
    got = next_aligned(T0, 60 * S, 120 * S, "check-1", None, [], timedelta(0))
    assert unix_second(got) % 120 == 8
    assert S <= got - T0 <= 120 * S


def test_next_aligned_before_1970_floors_the_second() -> None:
    now = datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC)
    got = next_aligned(now, 60 * S, 60 * S, "check-1", None, [], timedelta(0))
    assert unix_second(now) == -1
    assert unix_second(got) % 60 == 8
    assert got - now == 9 * S
    assert got.microsecond == 500_000


def test_next_aligned_is_elapsed_time_across_dst_and_keeps_the_zone() -> None:
    now = datetime(2026, 3, 29, 1, 59, 30, tzinfo=PARIS)  # 00:59:30 UTC, gap at 01:00 UTC
    got = next_aligned(now, 3600 * S, 3600 * S, "check-1", None, [], timedelta(0))
    elapsed = got.astimezone(UTC) - now.astimezone(UTC)
    assert S <= elapsed <= 3600 * S
    assert unix_second(got) % 3600 == phase_of("check-1", 3600 * S, 3600 * S, 0, timedelta(0))
    assert got.tzinfo is PARIS


@pytest.mark.parametrize(
    ("base", "job"),
    [(timedelta(0), 60 * S), (-S, 60 * S), (60 * S, timedelta(0)), (60 * S, -90 * S)],
)
def test_next_aligned_degenerate_periods_fall_back(base: timedelta, job: timedelta) -> None:
    now = T0 + timedelta(microseconds=7)
    assert next_aligned(now, base, job, "check-1", None, [], timedelta(0)) == now + job


def test_next_aligned_rejects_fractional_job_period() -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        next_aligned(T0, 60 * S, timedelta(seconds=1.5), "check-1", None, [], timedelta(0))


def test_next_aligned_rejects_naive_now() -> None:
    with pytest.raises(ValueError, match="now"):
        next_aligned(datetime(2026, 1, 1), 60 * S, 60 * S, "c", None, [], timedelta(0))


# --- Params: construction ------------------------------------------------------------------

DURATION_FIELDS = ["tier_credit_per_weight", "tier_credit_max", "check_timeout"]
DURATION_FIELDS += ["cost_timeout_floor"]
FLOAT_FIELDS = ["slow_threshold_ms", "cost_timeout_factor"]
FLOAT_FIELDS += ["lane_slow_threshold_ms", "lane_fast_threshold_ms"]


def test_params_fields_and_zero_defaults() -> None:
    assert [f.name for f in dataclasses.fields(Params)] == [
        "slow_threshold_ms",
        "tier_credit_per_weight",
        "tier_credit_max",
        "check_timeout",
        "cost_timeout_factor",
        "cost_timeout_floor",
        "lane_slow_threshold_ms",
        "lane_fast_threshold_ms",
    ]
    p = Params()
    for name in DURATION_FIELDS:
        assert getattr(p, name) == timedelta(0)
    for name in FLOAT_FIELDS:
        assert getattr(p, name) == 0.0
        assert isinstance(getattr(p, name), float)


def test_params_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Params().check_timeout = 5 * S


def test_params_converts_int_thresholds_to_float() -> None:
    p = Params(slow_threshold_ms=500, lane_slow_threshold_ms=2000)
    assert p.slow_threshold_ms == 500.0 and isinstance(p.slow_threshold_ms, float)
    assert isinstance(p.lane_slow_threshold_ms, float)


@pytest.mark.parametrize("name", DURATION_FIELDS)
def test_params_rejects_number_for_duration(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        Params(**{name: 15})


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", [True, "500", timedelta(seconds=1)])
def test_params_rejects_non_number_for_ms(name: str, bad: object) -> None:
    with pytest.raises(TypeError, match=name):
        Params(**{name: bad})


def full_settings(**overrides: object) -> types.SimpleNamespace:
    values: dict[str, object] = {
        "slow_threshold_ms": 250.0,
        "tier_credit_per_weight": 2 * S,
        "tier_credit_max": 10 * S,
        "check_timeout": 20 * S,
        "cost_timeout_factor": 3.0,
        "cost_timeout_floor": 2 * S,
        "lane_slow_threshold_ms": 2000,
        "lane_fast_threshold_ms": 500.0,
        "redis_url": "redis://ignored",
    }
    values.update(overrides)
    return types.SimpleNamespace(**values)


def test_from_settings_reads_same_named_attributes() -> None:
    p = Params.from_settings(full_settings())
    assert p == Params(
        slow_threshold_ms=250.0,
        tier_credit_per_weight=2 * S,
        tier_credit_max=10 * S,
        check_timeout=20 * S,
        cost_timeout_factor=3.0,
        cost_timeout_floor=2 * S,
        lane_slow_threshold_ms=2000.0,
        lane_fast_threshold_ms=500.0,
    )


def test_from_settings_none_means_off() -> None:
    p = Params.from_settings(full_settings(check_timeout=None, slow_threshold_ms=None))
    assert p.check_timeout == timedelta(0)
    assert p.slow_threshold_ms == 0.0
    assert p.effective_check_timeout() == DEFAULT_EXECUTION_TIMEOUT


def test_from_settings_zero_settings_is_zero_params() -> None:
    zeros = {f.name: 0 for f in dataclasses.fields(Params)}
    zeros.update({name: timedelta(0) for name in DURATION_FIELDS})
    assert Params.from_settings(types.SimpleNamespace(**zeros)) == Params()


def test_from_settings_missing_field_fails_loudly() -> None:
    settings = full_settings()
    del settings.cost_timeout_floor
    with pytest.raises(AttributeError, match="cost_timeout_floor"):
        Params.from_settings(settings)


def test_from_settings_type_errors_name_the_field() -> None:
    with pytest.raises(TypeError, match="check_timeout"):
        Params.from_settings(full_settings(check_timeout=20_000))


# --- Params: timeouts and cost sample ------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "expected"),
    [(timedelta(0), 15 * S), (-S, 15 * S), (20 * S, 20 * S), (5 * S, 5 * S)],
)
def test_effective_check_timeout(configured: timedelta, expected: timedelta) -> None:
    assert Params(check_timeout=configured).effective_check_timeout() == expected


def test_cost_sample_is_duration_unless_timed_out() -> None:
    assert Params().cost_sample_ms(1234.5, False) == 1234.5
    assert Params().cost_sample_ms(1234.5, True) == 15_000.0
    assert Params(check_timeout=20 * S).cost_sample_ms(1.0, True) == 20_000.0


@pytest.mark.parametrize("cost", [0.0, 1.0, 5_000.0, 1e12])
def test_execution_timeout_factor_off_is_flat_ceiling(cost: float) -> None:
    assert Params().execution_timeout(cost) == 15 * S
    assert Params(check_timeout=20 * S, cost_timeout_floor=S).execution_timeout(cost) == 20 * S


COST_AWARE = Params(cost_timeout_factor=3.0, cost_timeout_floor=2 * S, check_timeout=20 * S)


@pytest.mark.parametrize("cost", [0.0, -10.0, math.nan])
def test_execution_timeout_without_signal_is_full_ceiling_not_floor(cost: float) -> None:
    assert COST_AWARE.execution_timeout(cost) == 20 * S


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        (1000.0, 3 * S),
        (1234.5, timedelta(milliseconds=3703.5)),
        (100.0, 2 * S),  # 300 ms < floor
        (6_666.0, timedelta(milliseconds=19_998)),
        (7_000.0, 20 * S),  # 21 s > ceiling
        (math.inf, 20 * S),
        (1e300, 20 * S),
    ],
)
def test_execution_timeout_clamps_between_floor_and_ceiling(
    cost: float, expected: timedelta
) -> None:
    assert COST_AWARE.execution_timeout(cost) == expected


def test_execution_timeout_ceiling_wins_over_a_larger_floor() -> None:
    p = Params(cost_timeout_factor=1.0, cost_timeout_floor=30 * S)
    assert p.execution_timeout(10.0) == 15 * S


# --- Params: tier credit and effective deadline ---------------------------------------------


@pytest.mark.parametrize("weight", [0, -1, -100])
def test_tier_credit_free_jobs_get_none(weight: int) -> None:
    assert Params(tier_credit_per_weight=S, tier_credit_max=5 * S).tier_credit(weight) == (
        timedelta(0)
    )


def test_tier_credit_off_when_per_weight_zero() -> None:
    assert Params(tier_credit_max=5 * S).tier_credit(10) == timedelta(0)
    assert Params().tier_credit(10) == timedelta(0)


def test_tier_credit_scales_and_caps() -> None:
    p = Params(tier_credit_per_weight=2 * S, tier_credit_max=5 * S)
    assert p.tier_credit(1) == 2 * S
    assert p.tier_credit(2) == 4 * S
    assert p.tier_credit(3) == 5 * S
    assert p.tier_credit(10**30) == 5 * S  # caps before it could overflow


def test_tier_credit_uncapped_when_max_zero() -> None:
    assert Params(tier_credit_per_weight=2 * S).tier_credit(100) == 200 * S


def test_effective_zero_params_fresh_job_is_scheduled_at() -> None:
    assert Params().effective_scheduled_at(T0, 0.0, 0) == T0
    assert Params().effective_scheduled_at(T0, 0.0, 5) == T0


def test_effective_offset_is_weighted_cost_without_dead_band() -> None:
    assert Params().effective_scheduled_at(T0, 100.0, 0) == T0 + 200 * MS
    assert Params().effective_scheduled_at(T0, 0.0005, 0) == T0 + US


def test_effective_dead_band_on_weighted_cost() -> None:
    p = Params(slow_threshold_ms=500.0)
    assert p.effective_scheduled_at(T0, 249.9, 0) == T0  # 499.8 ms weighted: below
    assert p.effective_scheduled_at(T0, 250.0, 0) == T0 + 500 * MS  # reaches it
    assert p.effective_scheduled_at(T0, 1000.0, 0) == T0 + 2 * S


@pytest.mark.parametrize("cost", [15_000.0, 15_000.1, 1e9, math.inf])
def test_effective_offset_clamped_to_30s(cost: float) -> None:
    assert Params().effective_scheduled_at(T0, cost, 0) == T0 + 30 * S


@pytest.mark.parametrize("cost", [-1.0, -math.inf, math.nan])
def test_effective_nonsense_cost_gives_no_offset(cost: float) -> None:
    assert Params().effective_scheduled_at(T0, cost, 0) == T0


def test_effective_subtracts_tier_credit() -> None:
    p = Params(tier_credit_per_weight=2 * S, tier_credit_max=5 * S)
    assert p.effective_scheduled_at(T0, 1000.0, 2) == T0 + 2 * S - 4 * S
    assert p.effective_scheduled_at(T0, 0.0, 9) == T0 - 5 * S


def test_effective_tier_credit_can_outweigh_the_30s_bound() -> None:
    # Documents the limit of the anti-starvation bound: a paid on-time job (credit 10 s)
    # still beats a free job 35 s overdue with the maximal offset; 30 s + max credit holds.
    p = Params(tier_credit_per_weight=10 * S, tier_credit_max=10 * S)
    overdue = p.effective_scheduled_at(T0 - 35 * S, 1e9, 0)
    paid_on_time = p.effective_scheduled_at(T0, 0.0, 1)
    assert paid_on_time < overdue
    assert p.effective_scheduled_at(T0 - 40 * S - US, 1e9, 0) < paid_on_time


def test_effective_is_elapsed_time_and_keeps_the_zone() -> None:
    just_before_gap = datetime(2026, 3, 29, 1, 59, 50, tzinfo=PARIS)
    got = Params().effective_scheduled_at(just_before_gap, 10_000.0, 0)  # +20 s
    assert got.astimezone(UTC) - just_before_gap.astimezone(UTC) == 20 * S
    assert got == datetime(2026, 3, 29, 3, 0, 10, tzinfo=PARIS)
    assert got.tzinfo is PARIS


def test_effective_zero_offset_keeps_a_dst_gap_wall_time_verbatim() -> None:
    in_gap = datetime(2026, 3, 29, 2, 30, tzinfo=PARIS)  # does not exist on the wall clock
    assert Params().effective_scheduled_at(in_gap, 0.0, 0) is in_gap


def test_effective_rejects_naive() -> None:
    with pytest.raises(ValueError, match="scheduled_at"):
        Params().effective_scheduled_at(datetime(2026, 1, 1), 0.0, 0)


# --- Params.post_exec -----------------------------------------------------------------------

NEXT = T0 + 60 * S


def run_input(**overrides: object) -> PostExecInput:
    values: dict[str, object] = {
        "prev_cost_ewma_ms": 0.0,
        "prev_delay_ewma_ms": 0.0,
        "prev_lane": LANE_FAST,
        "plan_weight": 0,
        "scheduled_at": T0,
        "effective_scheduled_at": T0,
        "duration_ms": 400.0,
        "timed_out": False,
        "exec_start": T0 + 250 * MS,
        "next_scheduled_at": NEXT,
    }
    values.update(overrides)
    return PostExecInput(**values)


def test_post_exec_first_run_seeds_both_ewmas() -> None:
    state = Params().post_exec(run_input())
    assert state == PostExecState(
        cost_ewma_ms=400.0,
        delay_ewma_ms=250.0,
        effective_scheduled_at=NEXT + 800 * MS,
        lane=LANE_FAST,
    )


def test_post_exec_folds_into_previous_values() -> None:
    state = Params().post_exec(run_input(prev_cost_ewma_ms=1000.0, prev_delay_ewma_ms=100.0))
    assert state.cost_ewma_ms == pytest.approx(0.3 * 400 + 0.7 * 1000)
    assert state.delay_ewma_ms == pytest.approx(0.3 * 250 + 0.7 * 100)


def test_post_exec_without_exec_start_carries_delay_over() -> None:
    state = Params().post_exec(run_input(prev_delay_ewma_ms=777.0, exec_start=None))
    assert state.delay_ewma_ms == 777.0
    fresh = Params().post_exec(run_input(exec_start=None))
    assert fresh.delay_ewma_ms == 0.0


def test_post_exec_delay_falls_back_to_stored_effective() -> None:
    state = Params().post_exec(run_input(scheduled_at=None, effective_scheduled_at=T0 - S))
    assert state.delay_ewma_ms == 1250.0


def test_post_exec_timeout_pins_cost_to_ceiling() -> None:
    state = Params().post_exec(run_input(timed_out=True, duration_ms=3.0))
    assert state.cost_ewma_ms == 15_000.0
    assert state.effective_scheduled_at == NEXT + 30 * S
    custom = Params(check_timeout=20 * S).post_exec(run_input(timed_out=True))
    assert custom.cost_ewma_ms == 20_000.0


def test_post_exec_effective_and_lane_use_the_new_cost() -> None:
    p = Params(
        slow_threshold_ms=100.0,
        tier_credit_per_weight=S,
        tier_credit_max=3 * S,
        lane_slow_threshold_ms=2000.0,
        lane_fast_threshold_ms=500.0,
    )
    state = p.post_exec(run_input(prev_cost_ewma_ms=1000.0, duration_ms=5000.0, plan_weight=2))
    assert state.cost_ewma_ms == pytest.approx(2200.0)
    assert state.lane == LANE_SLOW
    assert state.effective_scheduled_at == NEXT + timedelta(milliseconds=4400) - 2 * S
    back = p.post_exec(run_input(prev_cost_ewma_ms=600.0, duration_ms=100.0, prev_lane=LANE_SLOW))
    assert back.cost_ewma_ms == pytest.approx(450.0)
    assert back.lane == LANE_FAST


def test_post_exec_delay_never_steers_order_or_lane() -> None:
    p = Params(lane_slow_threshold_ms=2000.0, lane_fast_threshold_ms=500.0)
    calm = p.post_exec(run_input(prev_cost_ewma_ms=1000.0, prev_lane=LANE_SLOW))
    starved = p.post_exec(
        run_input(
            prev_cost_ewma_ms=1000.0,
            prev_lane=LANE_SLOW,
            prev_delay_ewma_ms=90_000.0,
            exec_start=T0 + timedelta(minutes=10),
        )
    )
    assert starved.delay_ewma_ms > calm.delay_ewma_ms
    assert starved.effective_scheduled_at == calm.effective_scheduled_at
    assert starved.lane == calm.lane == LANE_SLOW


def test_post_exec_backwards_clock_floors_delay_sample() -> None:
    state = Params().post_exec(run_input(prev_delay_ewma_ms=100.0, exec_start=T0 - 5 * S))
    assert state.delay_ewma_ms == pytest.approx(70.0)


@pytest.mark.parametrize(
    "field", ["scheduled_at", "effective_scheduled_at", "exec_start", "next_scheduled_at"]
)
def test_post_exec_input_rejects_naive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        run_input(**{field: datetime(2026, 1, 1)})


def test_post_exec_values_are_frozen() -> None:
    state = Params().post_exec(run_input())
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.lane = LANE_SLOW
    with pytest.raises(dataclasses.FrozenInstanceError):
        run_input().timed_out = True
