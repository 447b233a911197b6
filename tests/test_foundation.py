"""The test set-up itself: a real redis-server, isolated state, and settings validation."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from support.environment import reset_checkbeat_environment

from celery_app.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parents[1]


def test_real_redis_server_answers(r, redis_server):
    info = r.info("server")
    assert int(info["tcp_port"]) == redis_server.port
    assert int(info["process_id"]) == redis_server.pid


def test_r_empties_what_an_earlier_test_left_in_the_state_db(redis_url, request):
    """A leftover is written first, then ``r`` is set up: one test, needing no other before it."""
    earlier = redis.Redis.from_url(redis_url)
    earlier.set("leftover", "1")
    earlier.close()
    r = request.getfixturevalue("r")
    assert r.dbsize() == 0
    assert r.get("leftover") is None


def test_a_test_sees_only_the_suites_checkbeat_variables(redis_server, pytestconfig):
    """Whatever the outer environment or an earlier test set, a test starts from these three
    (and the bundled redis-server, the one binary of the suite, and the partition count of
    ``--check-partitions`` when it is above one)."""
    from celery_app.local.embedded_redis import bundled_redis_server

    seen = {name: value for name, value in os.environ.items() if name.startswith("CHECKBEAT_")}
    bundled = bundled_redis_server()
    partitions = pytestconfig.getoption("check_partitions")
    assert seen == {
        "CHECKBEAT_REDIS_URL": redis_server.url(1),
        "CHECKBEAT_BROKER_URL": redis_server.url(0),
        "CHECKBEAT_KEY_PREFIX": "cbtest",
        **({"CHECKBEAT_REDIS_SERVER": bundled} if bundled else {}),
        **({"CHECKBEAT_CHECK_PARTITIONS": str(partitions)} if partitions > 1 else {}),
    }
    assert redis_server.binary == (bundled or redis_server.binary)
    settings = load_settings()
    assert settings.regions == ["local"]
    assert settings.pool_size == 8
    assert settings.imports == []


#: What a developer's shell might export while running the tests.
DEVELOPER_ENVIRONMENT = {
    "CHECKBEAT_REGIONS": "zz",
    "CHECKBEAT_POOL_SIZE": "3",
    "CHECKBEAT_KEY_PREFIX": "mine",
    "CHECKBEAT_IMPORTS": "no_such_module_of_mine",
    "CHECKBEAT_REDIS_URL": "redis://127.0.0.1:1/7",
}


def test_a_developers_checkbeat_variables_do_not_reach_the_tests():
    """pytest in a subprocess, its outer environment carrying a developer's CHECKBEAT_* values."""
    node = f"{Path(__file__).name}::test_a_test_sees_only_the_suites_checkbeat_variables"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{node}"],
        cwd=REPO,
        env={**os.environ, **DEVELOPER_ENVIRONMENT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_resetting_the_environment_keeps_only_the_suites_checkbeat_variables():
    environ = {"CHECKBEAT_REGIONS": "zz", "CHECKBEAT_KEY_PREFIX": "mine", "PATH": "/bin"}
    removed = reset_checkbeat_environment(environ, {"CHECKBEAT_KEY_PREFIX": "cbtest"})
    assert removed == ["CHECKBEAT_REGIONS"]
    assert environ == {"CHECKBEAT_KEY_PREFIX": "cbtest", "PATH": "/bin"}


def test_settings_read_environment_with_prefix(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_REGIONS", "eu, us")
    monkeypatch.setenv("CHECKBEAT_CHECK_TIMEOUT", "10")
    monkeypatch.setenv("CHECKBEAT_TIER_CREDIT_MAX", "PT2S")
    settings = load_settings()
    assert settings.regions == ["eu", "us"]
    assert settings.default_region == "eu"
    assert settings.check_timeout == timedelta(seconds=10)
    assert settings.tier_credit_max == timedelta(seconds=2)
    assert settings.effective_broker_url == os.environ["CHECKBEAT_BROKER_URL"]


def test_broker_url_defaults_to_redis_url(monkeypatch):
    monkeypatch.delenv("CHECKBEAT_BROKER_URL")
    monkeypatch.setenv("CHECKBEAT_REDIS_URL", "redis://example:6380/3")
    assert load_settings().effective_broker_url == "redis://example:6380/3"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"CHECKBEAT_CHECK_TIMEOUT": "-1"}, ["CHECKBEAT_CHECK_TIMEOUT", ">= 0"]),
        ({"CHECKBEAT_COST_TIMEOUT_FLOOR": "soon"}, ["CHECKBEAT_COST_TIMEOUT_FLOOR", "ISO 8601"]),
        ({"CHECKBEAT_TIMEZONE": "Mars/Base"}, ["CHECKBEAT_TIMEZONE", "Mars/Base", "IANA"]),
        (
            {"CHECKBEAT_POOL_SIZE": "4", "CHECKBEAT_FAST_LANE_RESERVED": "4"},
            ["CHECKBEAT_FAST_LANE_RESERVED", "CHECKBEAT_POOL_SIZE"],
        ),
        (
            {"CHECKBEAT_LANE_SLOW_THRESHOLD_MS": "500", "CHECKBEAT_LANE_FAST_THRESHOLD_MS": "500"},
            ["CHECKBEAT_LANE_FAST_THRESHOLD_MS", "CHECKBEAT_LANE_SLOW_THRESHOLD_MS"],
        ),
        ({"CHECKBEAT_POOL_SIZE": "0"}, ["CHECKBEAT_POOL_SIZE", ">= 1"]),
        ({"CHECKBEAT_REGIONS": ""}, ["CHECKBEAT_REGIONS", "at least one region"]),
        ({"CHECKBEAT_REGIONS": "eu,eu"}, ["CHECKBEAT_REGIONS", "distinct"]),
    ],
)
def test_invalid_settings_name_the_variable(monkeypatch, env, names):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    for name in names:
        assert name in str(info.value)


def test_lane_thresholds_may_be_equal_when_lanes_are_off(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_LANE_SLOW_THRESHOLD_MS", "0")
    monkeypatch.setenv("CHECKBEAT_LANE_FAST_THRESHOLD_MS", "0")
    assert load_settings().lane_slow_threshold_ms == 0


def test_celery_app_is_json_only_and_resolvable():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import celery_app; c = celery_app.app.conf; "
            "print(c.accept_content, c.task_serializer, c.beat_scheduler, "
            "c.broker_connection_max_retries)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["['json']", "json", "beat:CronScheduler", "None"]


def test_params_from_settings_carries_every_scheduling_knob(monkeypatch):
    from scheduling_core import Params

    monkeypatch.setenv("CHECKBEAT_SLOW_THRESHOLD_MS", "120")
    monkeypatch.setenv("CHECKBEAT_TIER_CREDIT_PER_WEIGHT", "2")
    monkeypatch.setenv("CHECKBEAT_TIER_CREDIT_MAX", "6")
    monkeypatch.setenv("CHECKBEAT_CHECK_TIMEOUT", "20")
    monkeypatch.setenv("CHECKBEAT_COST_TIMEOUT_FACTOR", "3")
    monkeypatch.setenv("CHECKBEAT_COST_TIMEOUT_FLOOR", "0.5")
    monkeypatch.setenv("CHECKBEAT_LANE_SLOW_THRESHOLD_MS", "900")
    monkeypatch.setenv("CHECKBEAT_LANE_FAST_THRESHOLD_MS", "400")
    params = Params.from_settings(load_settings())
    assert params == Params(
        slow_threshold_ms=120.0,
        tier_credit_per_weight=timedelta(seconds=2),
        tier_credit_max=timedelta(seconds=6),
        check_timeout=timedelta(seconds=20),
        cost_timeout_factor=3.0,
        cost_timeout_floor=timedelta(milliseconds=500),
        lane_slow_threshold_ms=900.0,
        lane_fast_threshold_ms=400.0,
    )
    assert params.tier_credit(5) == timedelta(seconds=6)
    assert params.effective_check_timeout() == timedelta(seconds=20)


def test_the_package_app_uses_the_test_redis():
    """conftest sets the environment before anything imports celery_app."""
    import celery_app

    assert celery_app.app.conf.broker_url == os.environ["CHECKBEAT_BROKER_URL"]
    assert celery_app.settings_of(celery_app.app).redis_url == os.environ["CHECKBEAT_REDIS_URL"]
