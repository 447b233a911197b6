"""Fixtures of the check store, jobs and dispatcher tests (a plugin listed in tests/conftest.py).

Their test data helpers (``at``, ``learned``, ``register_fake_worker``) are in
:mod:`support.checks`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from celery_app.checks.kinds import CheckFieldError, check_kind, unregister_kind
from celery_app.checks.store import CheckStore
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys
from celery_app.settings import Settings, load_settings

TEST_KIND = "testprobe"
REGIONS = ["eu", "us", "ap"]


def _validate(target: str, config: dict) -> dict:
    if "timeout" in config and not (
        isinstance(config["timeout"], int | float) and config["timeout"] > 0
    ):
        raise CheckFieldError("config.timeout", f"must be a number > 0, got {config['timeout']!r}")
    return {"timeout": 5, **config}


def _probe(target: str, config: dict) -> dict:
    return {"ok": True, "target": target}


@pytest.fixture
def test_kind() -> Iterator[str]:
    check_kind(TEST_KIND, validate=_validate)(_probe)
    yield TEST_KIND
    unregister_kind(TEST_KIND)


@pytest.fixture
def settings(redis_url: str, broker_url: str) -> Settings:
    return load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=REGIONS
    )


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return state_keys(settings)


@pytest.fixture
def store(r: redis.Redis, keys: Keys, settings: Settings, test_kind: str) -> CheckStore:
    return CheckStore(r, keys, settings)


@pytest.fixture
def dispatcher_app(settings: Settings) -> Iterator:
    """A Celery app built from the test settings (broker db 0, state db 1), closed after."""
    from celery_app.factory import create_app

    app = create_app(settings)
    yield app
    app.close()


@pytest.fixture
def broker(broker_url: str) -> Iterator[redis.Redis]:
    """The broker db, emptied before the test (queued messages are test state too)."""
    client = redis.Redis.from_url(broker_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def cli(dispatcher_app, store):
    """``celery -A <app> checks <args>`` in-process (click's runner): returns its output, and
    asserts it exited 0 (``ok=True``) or not (``ok=False``); ``.exit_code`` is the last one's."""
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_app.cli.checks import checks

    runner = CliRunner()
    obj = CLIContext(app=dispatcher_app, no_color=True, workdir=None, quiet=False)

    def invoke(*args: str, ok: bool = True, input: str | None = None) -> str:
        result = runner.invoke(checks, list(args), obj=obj, catch_exceptions=False, input=input)
        assert (result.exit_code == 0) is ok, result.output
        invoke.exit_code = result.exit_code
        return result.output

    invoke.obj = obj  # for a test that needs stdout alone
    return invoke
