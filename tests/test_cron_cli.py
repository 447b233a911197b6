"""``celery -A celery_app schedule|tenants ...`` as subprocesses, with user modules on the path.

The commands run as ``python -m celery_app.cli -A celery_app ...``: Celery's own CLI with the
subcommands attached, identical to the installed entry points.
"""

from __future__ import annotations

import json
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cron import broker_headers
from support.projects import run_module

from celery_app.redis.schema import Keys
from celery_app.wall_clock import TEST_CLOCK_ENV, Clock

ROOT = Path(__file__).resolve().parents[1]
KEYS = Keys("cbtest")

GOOD = """
from datetime import timedelta
from celery_app import cron

@cron("*/5 * * * *", id="report", timeout=timedelta(minutes=2))
def report(): ...

@cron("0 3 * * *", id="per-t", per_tenant=True)
def per_tenant(tenant): ...
"""

BAD = """
from celery_app import cron

@cron("0 25 * * *", id="nightly-report")
def nightly(): ...
"""


def run_cli(tmp_path: Path, *args: str, module: str = "goodmod", **env: str):
    return run_module(
        "celery_app.cli", "-A", "celery_app", *args, cwd=ROOT, pythonpath=[ROOT, tmp_path],
        CHECKBEAT_IMPORTS=module, **env,
    )  # fmt: skip


@pytest.fixture
def user_modules(tmp_path: Path) -> Path:
    (tmp_path / "goodmod.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "badmod.py").write_text(textwrap.dedent(BAD))
    return tmp_path


def test_bad_spec_in_a_user_module_fails_the_command_naming_the_task(user_modules):
    result = run_cli(user_modules, "schedule", "list", module="badmod")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "nightly-report" in output
    assert "0 25 * * *" in output
    assert "bad token '25'" in output


def test_tenants_and_schedule_list(user_modules, r):
    added = run_cli(user_modules, "tenants", "add", "acme", "globex")
    assert added.returncode == 0, added.stderr
    refused = run_cli(user_modules, "tenants", "add", "initech", "bad name")
    assert refused.returncode != 0
    assert "'bad name' is not allowed" in refused.stderr
    assert r.smembers(KEYS.tenants()) == {"acme", "globex"}  # nothing half-written
    listed = run_cli(user_modules, "tenants", "list")
    assert listed.stdout.split() == ["acme", "globex"]

    table = run_cli(user_modules, "schedule", "list")
    assert table.returncode == 0, table.stderr
    assert "report" in table.stdout and "per-tenant" in table.stdout
    as_json = json.loads(run_cli(user_modules, "schedule", "list", "--json").stdout)
    rows = {row["id"]: row for row in as_json}
    assert rows["report"]["spec"] == "*/5 * * * *"
    assert rows["report"]["timeout_s"] == 120
    assert rows["per-t"]["scope"] == "per-tenant"
    next_fire = datetime.fromisoformat(rows["report"]["next_fire"])
    assert next_fire.minute % 5 == 0 and next_fire > datetime.now(UTC).replace(second=0)


def test_run_now_and_diagnose_exit_codes(user_modules, broker_url, r):
    import redis

    redis.Redis.from_url(broker_url).flushdb()
    unknown = run_cli(user_modules, "schedule", "run", "nope")
    assert unknown.returncode != 0 and "unknown cron task 'nope'" in unknown.stderr
    missing = run_cli(user_modules, "schedule", "run", "per-t")
    assert missing.returncode != 0 and "pass --tenant" in missing.stderr

    # Both run-now calls must land in one */5 window: a clock that starts a minute into a window
    # and runs at a thousandth of real speed keeps them there however slow the machine is.
    window_clock = Clock(datetime(2026, 1, 1, 12, 1, tzinfo=UTC), time.time(), 0.001)
    pinned = {TEST_CLOCK_ENV: window_clock.encode()}
    sent = run_cli(user_modules, "schedule", "run", "report", **pinned)
    assert sent.returncode == 0, sent.stderr
    assert [h["cron_task"] for h in broker_headers(broker_url)] == ["report"]
    assert broker_headers(broker_url)[0]["cron_manual"] is True
    twice = run_cli(user_modules, "schedule", "run", "report", **pinned)
    assert twice.returncode == 1 and "already fired by manual:" in twice.stdout

    no_beat = run_cli(user_modules, "schedule", "diagnose", **pinned)
    assert no_beat.returncode == 1
    assert "no live beat" in no_beat.stdout
    r.hset(KEYS.beat_heartbeat(), "beat-x", window_clock.now().timestamp())
    healthy = run_cli(user_modules, "schedule", "diagnose", **pinned)
    assert healthy.returncode == 0, healthy.stdout
    healthy_json = run_cli(user_modules, "schedule", "diagnose", "--json", **pinned)
    assert healthy_json.returncode == 0 and json.loads(healthy_json.stdout) == []
    no_provider = run_cli(
        user_modules, "schedule", "diagnose", "--json", CHECKBEAT_TENANTS_PROVIDER="none", **pinned
    )
    assert no_provider.returncode == 1
    (finding,) = [f for f in json.loads(no_provider.stdout) if f["kind"] == "no_tenants_provider"]
    assert set(finding) == {"kind", "subject", "message", "since"}  # as `checks diagnose --json`
    assert finding["subject"] == "per-t" and "no tenants provider" in finding["message"]
