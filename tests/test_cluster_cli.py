"""Every CLI path that reads or writes the state works on a Redis Cluster: checks add, update,
disable, enable, list, show, rate limits, maintenance windows (transactions), reconcile and
diagnose (SCAN over every primary), runtime schedules (a WATCH transaction), tenants, schedule
list and diagnose, ``checkbeat status`` data and a quarantine; each writes only keys of its half.

In process (click's runner) on the three-master cluster of the ``redis_cluster`` fixture, the
broker on its separate plain redis-server.
"""

from __future__ import annotations

import json

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner
from redis.crc import key_slot

from celery_app.checks.quarantine import quarantine
from celery_app.cli.checks import checks
from celery_app.cli.schedule import schedule
from celery_app.cli.tenants import tenants
from celery_app.factory import create_app
from celery_app.local.status import collect_status
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CHECKS_TAG, CRON_TAG, QuarantineStep, partition_tags
from celery_app.settings import load_settings

pytestmark = pytest.mark.timeout(120)


def test_the_cli_reads_and_writes_the_state_on_a_redis_cluster(redis_cluster, test_kind):
    settings = load_settings(
        redis_url=redis_cluster.url(),
        broker_url=redis_cluster.broker_url(),
        regions="eu,us",
    )
    app = create_app(settings)
    keys = state_keys(settings)
    client = get_redis(settings.redis_url, settings)
    runner = CliRunner()
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=False)

    def run(group, *args: str, code: int = 0) -> str:
        result = runner.invoke(group, list(args), obj=obj, catch_exceptions=False)
        assert result.exit_code == code, (args, result.output)
        return result.output

    for i in range(3):
        run(checks, "add", f"c{i}", "--tenant", "acme", "--kind", test_kind, "--target", "x",
            "--period", "30", "--regions", "eu,us")  # fmt: skip
    run(checks, "update", "c0", "--period", "60")
    run(checks, "disable", "c1")
    run(checks, "enable", "c1")
    run(checks, "ratelimit", "acme", "--per-minute", "60")
    run(checks, "maintenance", "add", "--check", "c2", "--cron", "0 3 * * *", "--duration", "600")
    assert "c2" in run(checks, "maintenance", "list")
    assert {row["uid"] for row in json.loads(run(checks, "list", "--json"))} == {"c0", "c1", "c2"}
    assert "c0" in run(checks, "show", "c0")
    assert quarantine(client, keys, "c1@us", QuarantineStep.CLAIM, "torn field", 1.0)
    found = json.loads(run(checks, "diagnose", "--json", code=1))  # 1: it found a problem
    assert [f["subject"] for f in found if f["kind"] == "quarantined"] == ["c1@us"]
    report = json.loads(run(checks, "reconcile", "--json"))
    assert report, report
    # rebuilt from its definition
    assert client.sismember(keys.of_check("c1").quarantine(), "c1@us") == 0
    run(checks, "rm", "c2")

    run(tenants, "add", "acme", "globex")
    assert "globex" in run(tenants, "list")
    run(schedule, "add", "nightly", "--task", "celery.backend_cleanup", "--cron", "0 4 * * *")
    run(schedule, "pause", "nightly")
    assert "nightly" in run(schedule, "list")
    assert "no live beat" in run(schedule, "diagnose", code=1)  # read from the cron half
    run(schedule, "rm", "nightly")

    status = collect_status(app)
    assert {row["uid"] for row in status["checks"]} >= {"c0", "c1"}, status["checks"]

    slots = {key_slot(k.encode()) for k in client.scan_iter(match=f"{settings.key_prefix}:*")}
    # the cron half's slot and one per partition of the check half (each holds the bucket)
    check_half = {key_slot(tag.encode()) for tag in partition_tags(keys.partitions)}
    assert slots == check_half | {key_slot(CRON_TAG.encode())}
    assert keys.partitions > 1 or check_half == {key_slot(CHECKS_TAG.encode())}
