"""One registry per app for check kinds, cron tasks and the tenants provider.

Decorators without ``app=`` register shared entries every app's registry includes (built before
or after the declaration); with ``app=`` they register on that app only. Settings come from the
app reading the registry, never from the process's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_app.checks.kinds import check_kind, get_kind, registered_kinds, unregister_kind
from celery_app.checks.store import CheckStore
from celery_app.cron_tasks.registration import cron, cron_tasks, unregister_cron
from celery_app.cron_tasks.tenants_provider import (
    read_tenants,
    resolve_tenants,
    tenants_provider,
    unregister_tenants_provider,
)
from celery_app.errors import CheckFieldError
from celery_app.factory import create_app
from celery_app.registry import SHARED, RegistryConflict, registry_of
from celery_app.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = """
from celery_app import cron, tenants_provider
from celery_app.checks.kinds import check_kind

@tenants_provider
def active_tenants():
    return ["acme", "globex"]

@check_kind("usermod-kind")
def probe(target, config, context):
    return None

@cron("0 3 * * *", id="usermod-nightly")
def nightly():
    return None
"""


def test_a_provider_registered_at_import_survives_fresh_app(tmp_path: Path):
    """The ``checkbeat up`` path: the user module is imported while ``celery_app.app`` is built,
    then ``fresh_app()`` builds the app ``up`` uses. Its provider (and its kind and cron task)
    must still be the ones read; before the registry, the provider was an attribute of the first
    app only and the fresh app fell back to the Redis set."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent(USER_MODULE))
    script = textwrap.dedent(
        """
        import celery_app
        from celery_app.checks.kinds import get_kind
        from celery_app.cron_tasks.registration import cron_tasks
        from celery_app.cron_tasks.tenants_provider import read_tenants, resolve_tenants
        from celery_app.local.bootstrap import fresh_app
        from celery_app.registry import registry_of

        celery_app.app  # built first: imports usermod (CHECKBEAT_IMPORTS)
        for app in (celery_app.app, fresh_app()):
            source = resolve_tenants(app)
            kind = get_kind(registry_of(app), "usermod-kind").probe.__module__
            print(source.describe, read_tenants(source), kind, list(cron_tasks(app)))
        """
    )
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), CHECKBEAT_IMPORTS="usermod")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    expected = (
        "@tenants_provider usermod.active_tenants ['acme', 'globex'] usermod ['usermod-nightly']"
    )
    assert done.stdout.splitlines() == [expected, expected]


# --- shared and per-app entries ---------------------------------------------------------------


@pytest.fixture
def apps(r: redis.Redis) -> Iterator[list[Celery]]:
    """Apps built by the test (closed after it)."""
    built: list[Celery] = []
    yield built
    for app in built:
        app.close()


def _app(apps: list[Celery], **settings: object) -> Celery:
    app = create_app(load_settings(**settings))
    app.loader.import_default_modules()  # as the CLI and workers do: the built-in kinds
    apps.append(app)
    return app


def _shared_provider() -> list[str]:
    return ["shared-t"]


def test_shared_entries_reach_apps_built_before_and_after(apps):
    before = _app(apps)
    check_kind("reg-shared")(_probe_a)
    cron("0 4 * * *", id="reg-shared-cron", name="reg.shared_cron")(_noop)
    tenants_provider(_shared_provider)
    try:
        after = _app(apps)
        for app in (before, after):
            assert get_kind(registry_of(app), "reg-shared").probe is _probe_a
            assert cron_tasks(app)["reg-shared-cron"].spec == "0 4 * * *"
            source = resolve_tenants(app)
            assert source.describe == f"@tenants_provider {__name__}._shared_provider"
            assert read_tenants(source) == ["shared-t"]
    finally:
        unregister_kind("reg-shared")
        unregister_cron("reg.shared_cron")
        unregister_tenants_provider()
    assert "reg-shared" not in registered_kinds(registry_of(before))
    assert "reg-shared-cron" not in cron_tasks(before)
    assert resolve_tenants(before).describe.startswith("redis set ")


def test_app_entries_stay_on_their_app_and_shadow_shared_ones(apps):
    mine, other = _app(apps), _app(apps)
    check_kind("reg-own", app=mine)(_probe_a)
    cron("0 5 * * *", app=mine, id="reg-own-cron", name="reg.own_cron")(_noop)
    tenants_provider(_shared_provider)
    try:

        @tenants_provider(app=mine)
        def own_tenants():
            return ["own-t"]

        assert "reg-own" in registered_kinds(registry_of(mine))
        with pytest.raises(CheckFieldError, match="unknown kind 'reg-own'") as unknown:
            get_kind(registry_of(other), "reg-own")
        assert "http" in str(unknown.value)  # the error lists what the app does know
        assert "reg-own-cron" in cron_tasks(mine)
        assert "reg-own-cron" not in cron_tasks(other)
        assert read_tenants(resolve_tenants(mine)) == ["own-t"]
        assert read_tenants(resolve_tenants(other)) == ["shared-t"]
    finally:
        unregister_tenants_provider()


def test_a_name_is_taken_once_per_registry_but_a_reimport_is_fine(apps):
    app = _app(apps)
    check_kind("reg-clash", app=app)(_probe_a)
    check_kind("reg-clash", app=app)(_probe_a)  # the same function again: a re-import
    with pytest.raises(RegistryConflict) as clash:
        check_kind("reg-clash", app=app)(_probe_b)
    message = str(clash.value)
    assert "check kind 'reg-clash'" in message
    assert f"{__name__}._probe_a" in message and f"{__name__}._probe_b" in message
    assert get_kind(registry_of(app), "reg-clash").probe is _probe_a

    tenants_provider(app=app)(_shared_provider)
    with pytest.raises(RegistryConflict, match="tenants provider"):
        tenants_provider(app=app)(_probe_b)
    cron("* * * * *", app=app, name="reg.clash")(_noop)
    with pytest.raises(RegistryConflict, match=r"cron task 'reg\.clash'"):
        cron("* * * * *", app=app, name="reg.clash")(_probe_b)


# --- settings from the app ------------------------------------------------------------------


def test_a_cron_task_without_timezone_follows_the_app_reading_it(apps):
    berlin = _app(apps, timezone="Europe/Berlin")
    utc = _app(apps, timezone="UTC")
    cron("0 3 * * *", id="reg-tz", name="reg.tz")(_noop)
    cron("0 3 * * *", id="reg-tz-ny", name="reg.tz_ny", timezone="America/New_York")(_noop)
    try:
        at = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
        in_berlin, in_utc = cron_tasks(berlin)["reg-tz"], cron_tasks(utc)["reg-tz"]
        assert (in_berlin.timezone, in_utc.timezone) == ("Europe/Berlin", "UTC")
        assert in_berlin.next_fire(at) == datetime(2026, 1, 11, 2, 0, tzinfo=UTC)  # 03:00 CET
        assert in_utc.next_fire(at) == datetime(2026, 1, 11, 3, 0, tzinfo=UTC)
        # a declared timezone is the task's own, whatever the app's
        assert cron_tasks(berlin)["reg-tz-ny"].timezone == "America/New_York"
        assert cron_tasks(utc)["reg-tz-ny"].timezone == "America/New_York"
    finally:
        unregister_cron("reg.tz")
        unregister_cron("reg.tz_ny")


def test_a_store_validates_with_its_apps_settings_and_kinds(apps, r, monkeypatch):
    # The environment allows private targets; the app's settings do not, and they decide.
    monkeypatch.setenv("CHECKBEAT_ALLOW_PRIVATE_TARGETS", "1")
    closed = _app(apps, allow_private_targets=False)
    store = CheckStore.for_app(closed)
    with pytest.raises(CheckFieldError) as refused:
        store.create(uid="lo", tenant="t", kind="tcp", target="127.0.0.1:80", period=60)
    assert refused.value.field == "target"
    assert store.create(uid="pub", tenant="t", kind="tcp", target="8.8.8.8:53", period=60)

    check_kind("reg-store", app=closed)(_probe_a)
    assert store.create(uid="own", tenant="t", kind="reg-store", target="x", period=60)
    shared_only = CheckStore(store.redis, store.keys, store.settings)  # no app: shared kinds
    with pytest.raises(CheckFieldError, match="unknown kind 'reg-store'"):
        shared_only.create(uid="own2", tenant="t", kind="reg-store", target="x", period=60)


def test_the_shared_registry_is_what_every_app_reads_through(apps):
    app = _app(apps)
    assert registry_of(app) is registry_of(app)
    assert registry_of(app).parent is SHARED
    assert {"http", "tcp"} <= set(registered_kinds(SHARED))  # built-ins are shared


def _probe_a(target, config, context):
    return None


def _probe_b(target, config, context):
    return None


def _noop() -> None:
    return None
