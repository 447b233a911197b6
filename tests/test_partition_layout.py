"""The partition count of the check half is the one it was built with: a beat, worker or
command given another refuses with one line naming the setting, and a count is changed by
moving the checks through an empty check half (export, delete, apply: docs/scale.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.projects import run_module

from celery_app.checks.layout import PartitionLayoutError, ensure_layout, stored_partitions
from celery_app.checks.manifest import load_manifest
from celery_app.checks.manifest_sync import (
    apply_plan,
    dump_manifest,
    export_manifest,
    plan_manifest,
)
from celery_app.checks.store import CheckStore
from celery_app.redis.keyspace import state_keys
from celery_app.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]


def _store(redis_url: str, broker_url: str, partitions: int, r) -> CheckStore:
    settings = load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=["eu", "us"],
        check_partitions=partitions,
    )  # fmt: skip
    return CheckStore(r, state_keys(settings), settings)


@pytest.mark.timeout(60)
def test_a_changed_count_is_refused_until_the_checks_move(
    tmp_path, r, redis_url, broker_url, test_kind
):
    one = _store(redis_url, broker_url, 1, r)
    ensure_layout(r, one.keys)
    for i in range(6):
        one.create(uid=f"c{i}", tenant="acme", kind=test_kind, target=f"c{i}", period=60,
                   regions=["eu", "us"])  # fmt: skip
    assert stored_partitions(r, one.keys) == 1

    refused = run_module(
        "celery_app.cli", "-A", "celery_app", "checks", "list", cwd=ROOT, pythonpath=[ROOT],
        CHECKBEAT_CHECK_PARTITIONS="4",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "CHECKBEAT_CHECK_PARTITIONS=4" in lines[0] and "1 partition" in lines[0]
    four = _store(redis_url, broker_url, 4, r)
    with pytest.raises(PartitionLayoutError):
        ensure_layout(r, four.keys)

    # the documented move: export, delete every check, then apply under the new count
    text = dump_manifest(export_manifest(one, include_secrets=True), include_secrets=True)
    for uid in one.uids():
        one.delete(uid)
    ensure_layout(r, four.keys)  # an empty check half takes the new count
    assert stored_partitions(r, four.keys) == 4
    path = tmp_path / "checks.yaml"
    path.write_text(text)
    apply_plan(four, plan_manifest(four, load_manifest(path.read_text(), four.settings)))
    assert four.uids() == [f"c{i}" for i in range(6)]
    homes = {four.keys.of_check(f"c{i}").partition for i in range(6)}
    assert len(homes) > 1  # spread over the partitions
    for i in range(6):  # each check and its jobs in its own partition, due there
        part = four.keys.of_check(f"c{i}")
        assert r.sismember(part.checks(), f"c{i}")
        assert r.zscore(part.due(), f"c{i}@eu") is not None
    listed = run_module(
        "celery_app.cli", "-A", "celery_app", "checks", "list", cwd=ROOT, pythonpath=[ROOT],
        CHECKBEAT_CHECK_PARTITIONS="4",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert all(f"c{i}" in listed.stdout for i in range(6))
    with pytest.raises(PartitionLayoutError):
        ensure_layout(r, one.keys)
