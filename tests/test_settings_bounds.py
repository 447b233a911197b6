"""Every numeric setting refuses NaN, infinities and absurd magnitudes, naming the variable and
its allowed range; durations take seconds or ISO 8601, dispatch interval and lease margin too."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from celery_app.checks.repair import check_uids
from celery_app.checks.store import CheckStore
from celery_app.redis.keyspace import state_keys
from celery_app.settings import BOUNDS, Settings, SettingsError, load_settings
from celery_app.settings.declare import declared, described

BAD_FOR_EVERY_NUMBER = ["nan", "NaN", "inf", "-inf", "1e20", "-1e20", "1e400", "1" * 500]


def refused(monkeypatch, variable: str, value: str) -> str:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    return str(caught.value)


@pytest.mark.parametrize("name", sorted(BOUNDS))
@pytest.mark.parametrize("value", BAD_FOR_EVERY_NUMBER)
def test_every_number_refuses_nan_infinity_and_huge_values(monkeypatch, name, value):
    variable = f"CHECKBEAT_{name.upper()}"
    message = refused(monkeypatch, variable, value)
    assert f"{variable}=" in message
    assert BOUNDS[name].text() in message  # the allowed range, as the README states it
    assert "Traceback" not in message and "OverflowError" not in message


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_number_refuses_just_outside_its_range(monkeypatch, name):
    bound = BOUNDS[name]
    variable = f"CHECKBEAT_{name.upper()}"
    above = float(bound.high) + 1
    message = refused(monkeypatch, variable, str(int(above)))
    assert variable in message and BOUNDS[name].text() in message
    monkeypatch.delenv(variable)
    below = bound.low if bound.low_open else bound.low - 1
    message = refused(monkeypatch, variable, str(int(below)))
    assert variable in message and BOUNDS[name].text() in message


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_range_is_in_the_variables_description(name):
    assert described(Settings.model_fields[name]).endswith(f" Allowed: {BOUNDS[name].text()}.")


@pytest.mark.parametrize(
    "name",
    sorted(n for n, info in Settings.model_fields.items() if info.annotation is timedelta),
)
def test_a_timedelta_setting_is_a_duration_in_seconds_by_its_type(monkeypatch, name):
    # No `duration=True` on these declarations: the type says it, and the range is in seconds.
    assert declared(Settings.model_fields[name]).duration
    assert BOUNDS[name].unit == " s"
    high = timedelta(seconds=BOUNDS[name].high)
    monkeypatch.setenv(f"CHECKBEAT_{name.upper()}", "PT" + f"{high.total_seconds():g}S")
    assert getattr(load_settings(), name) == high  # ISO 8601 read as a duration, at its edge


def test_every_number_is_declared_with_its_range():
    # BOUNDS is read off each setting's declaration: a number declared without a range would
    # escape every test above, so each int, float and duration must have one.
    numbers = {
        name
        for name, info in Settings.model_fields.items()
        if info.annotation in (int, float, timedelta)
    }
    assert numbers == set(BOUNDS)


def test_the_edges_of_each_range_are_accepted(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_POOL_SIZE", "10000")
    monkeypatch.setenv("CHECKBEAT_FAST_LANE_RESERVED", "9999")
    monkeypatch.setenv("CHECKBEAT_CHECK_TIMEOUT", "P1D")
    monkeypatch.setenv("CHECKBEAT_LEASE_MARGIN", "0")
    monkeypatch.setenv("CHECKBEAT_DISPATCH_INTERVAL", "60")
    monkeypatch.setenv("CHECKBEAT_LANE_SLOW_THRESHOLD_MS", "86400000")
    settings = load_settings()
    assert settings.pool_size == 10_000 and settings.fast_lane_reserved == 9_999
    assert settings.check_timeout == timedelta(days=1)
    assert settings.lease_margin == 0.0 and settings.dispatch_interval == 60.0


@pytest.mark.parametrize(
    ("variable", "value", "seconds"),
    [
        ("CHECKBEAT_DISPATCH_INTERVAL", "PT1S", 1.0),
        ("CHECKBEAT_DISPATCH_INTERVAL", "PT0.25S", 0.25),
        ("CHECKBEAT_DISPATCH_INTERVAL", "0.5", 0.5),
        ("CHECKBEAT_LEASE_MARGIN", "PT1M", 60.0),
        ("CHECKBEAT_LEASE_MARGIN", "2.5", 2.5),
    ],
)
def test_dispatch_interval_and_lease_margin_take_iso_8601_as_float_seconds(
    monkeypatch, variable, value, seconds
):
    monkeypatch.setenv(variable, value)
    settings = load_settings()
    got = getattr(settings, variable.removeprefix("CHECKBEAT_").lower())
    assert type(got) is float and got == seconds


@pytest.mark.parametrize(
    ("variable", "value", "phrase"),
    [
        ("CHECKBEAT_DISPATCH_INTERVAL", "PT0S", "> 0 s and <= 60 s"),
        ("CHECKBEAT_DISPATCH_INTERVAL", "PT2M", "> 0 s and <= 60 s"),
        ("CHECKBEAT_LEASE_MARGIN", "-PT1S", ">= 0 s and <= 3,600 s (1 hour)"),
        ("CHECKBEAT_CHECK_TIMEOUT", "P99999999999D", "ISO 8601"),
        ("CHECKBEAT_CRON_GRACE", "P2D", "> 0 s and <= 86,400 s (1 day)"),
        ("CHECKBEAT_CRON_GRACE", "soon", "ISO 8601"),
        ("CHECKBEAT_POOL_SIZE", "eight", ">= 1 and <= 10,000"),
        ("CHECKBEAT_POOL_SIZE", "2.5", ">= 1 and <= 10,000"),
    ],
)
def test_bad_durations_and_integers_name_the_variable_and_range(
    monkeypatch, variable, value, phrase
):
    message = refused(monkeypatch, variable, value)
    assert f"{variable}={value!r}" in message and phrase in message


def test_python_overrides_are_bounded_like_the_environment():
    for overrides in ({"cron_grace": 10**400}, {"lease_margin": float("nan")},
                      {"check_timeout": timedelta(days=2)}, {"pool_size": 10**30}):  # fmt: skip
        with pytest.raises(SettingsError) as caught:
            load_settings(**overrides)
        (name,) = overrides
        assert f"CHECKBEAT_{name.upper()}=" in str(caught.value)
        assert BOUNDS[name].text() in str(caught.value)
        assert len(str(caught.value)) < 400  # a huge value is cut, not printed in full


@pytest.mark.parametrize("prefix", ["cb[", "cb*", "cb?", "cb\\x", "cb]", "cb x", "", "cb\x1b",
                                    "cb\n", ":cb", "x" * 101])  # fmt: skip
def test_the_key_prefix_refuses_glob_and_control_characters(monkeypatch, prefix):
    message = refused(monkeypatch, "CHECKBEAT_KEY_PREFIX", prefix)
    assert "CHECKBEAT_KEY_PREFIX" in message and "SCAN" in message


def test_an_allowed_prefix_works_in_reconciles_scan_pattern(r, redis_url, monkeypatch):
    from celery_app.checks.kinds import check_kind, unregister_kind

    check_kind("prefixprobe")(lambda target, config: {"ok": True})
    try:
        settings = load_settings(redis_url=redis_url, key_prefix="team.a:cb-1_x")
        store = CheckStore(r, state_keys(settings), settings)
        store.create(uid="c1", tenant="acme", kind="prefixprobe", target="x", period=60)
        assert list(check_uids(r, store.keys.of_check("c1"))) == ["c1"]  # its partition's scan
    finally:
        unregister_kind("prefixprobe")


@pytest.mark.parametrize("regions", ['["eu\\n"]', '["eu us"]', '["e\\u001bu"]', '["é"]'])
def test_regions_are_matched_whole(monkeypatch, regions):
    message = refused(monkeypatch, "CHECKBEAT_REGIONS", regions)
    assert "CHECKBEAT_REGIONS" in message and "letters, digits" in message


@pytest.mark.parametrize("value", ["inf", "1e20"])
def test_the_checkbeat_command_prints_the_message_not_a_traceback(tmp_path, value):
    env = dict(os.environ, CHECKBEAT_CHECK_TIMEOUT=value)
    result = subprocess.run(
        [sys.executable, "-m", "celery_app.cli.main", "status", "--data-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"CHECKBEAT_CHECK_TIMEOUT='{value}'" in result.stderr
    assert "<= 86,400 s (1 day)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "value", ["0.0.0.0", "::", "0.1.2.3", "::ffff:0.0.0.0", "10.0.0.7,0.0.0.0"]
)
def test_an_unspecified_address_is_refused_in_the_allow_list(monkeypatch, value):
    """A connect to 0.0.0.0 (or ::) reaches this host: allowing it would open loopback."""
    message = refused(monkeypatch, "CHECKBEAT_ALLOWED_TARGET_ADDRESSES", value)
    assert message.count("\n") == 1  # the head line, then this variable's line
    assert "CHECKBEAT_ALLOWED_TARGET_ADDRESSES=" in message
    assert "is an unspecified address (0.0.0.0/8, ::): a connection to it reaches this host" in (
        message
    )


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("CHECKBEAT_METRICS_BASIC_AUTH", "no-colon-s3cret", "must be user:password"),
        ("CHECKBEAT_METRICS_BASIC_AUTH", ":s3cret", "must be user:password"),
        ("CHECKBEAT_METRICS_BEARER_TOKEN", "s3cret token", "must be visible ASCII, no spaces"),
    ],
)
def test_a_bad_metrics_credential_is_named_never_shown(monkeypatch, variable, value, reason):
    message = refused(monkeypatch, variable, value)
    assert f"{variable}='***': {reason}" in message
    assert "s3cret" not in message


def test_metrics_credentials_are_not_in_the_settings_repr():
    settings = load_settings(metrics_basic_auth="prom:s3cret", metrics_bearer_token="t0k3n")
    assert "s3cret" not in repr(settings) and "t0k3n" not in repr(settings)
    assert settings.metrics_basic_auth.get_secret_value() == "prom:s3cret"
    assert load_settings(metrics_bearer_token="").metrics_bearer_token is None
