"""Unit tests for scheduling_core's math: every documented edge of every function."""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from scheduling_core import (
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


def test_jitter_rejects_non_str_uid() -> None:
    with pytest.raises(TypeError, match="check_uid"):
        jitter_for(b"check-1", 60 * S)  # type: ignore[arg-type]


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
