"""A prefork check worker's ``/metrics`` sums the series of all its pool children exactly.

The runs happen in the children; the parent serves ``/metrics``. After the checks are disabled
and every run is written, the scraped run count equals the runs the jobs recorded in Redis, and
the multiprocess directory holds the files of at least two children (both slots did work).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.partitions import suite_keys
from support.polling import wait_for
from support.processes import http_status, http_text

from celery_app.checks.jobs import read_jobs
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import free_port
from celery_app.redis.schema import LANE_NAMES, check_queue, job_id

pytestmark = pytest.mark.slow

KEYS = suite_keys("cbtest")
UIDS = ("p1", "p2", "p3", "p4")


def scraped(url: str, name: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(http_text(url)):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


@pytest.mark.timeout(120)
def test_prefork_children_runs_are_summed_by_the_parent(
    tmp_path: Path, r, broker, make_app, start_worker_process, dispatching, target, allow_private
):
    mp = tmp_path / "multiproc"
    mp.mkdir()
    (mp / "counter_1.db").write_bytes(b"stale: from an earlier run")
    port = free_port()
    settings = {"pool_size": 3, "fast_lane_reserved": 1, "allow_private_targets": True}
    env = {f"CHECKBEAT_{k.upper()}": str(v) for k, v in settings.items()}
    worker = start_worker_process(
        *("--role", "shared", "-P", "prefork", "-n", "shared@prefork"),
        **env,
        CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{port}",
        PROMETHEUS_MULTIPROC_DIR=str(mp),
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(f"{url}/healthz") == 200, 60, interval=0.2, what="/healthz")
    assert not (mp / "counter_1.db").exists()  # a given directory is emptied at start

    app = make_app(**settings)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    for uid in UIDS:
        store.create(uid=uid, tenant="t", kind="http", target=target.url("/delay/150"), period=1)
    ticker = dispatching(app, interval=0.1)
    jobs = [job_id(uid, "local") for uid in UIDS]
    wait_for(
        lambda: sum(j.runs for j in read_jobs(r, KEYS, jobs) if j) >= 16,
        60,
        interval=0.2,
        what="16 runs",
    )
    for uid in UIDS:
        store.set_enabled(uid, False)
    ticker.stop()

    def quiet() -> bool:
        leases = sum(r.zcard(KEYS.leases("local", lane)) for lane in range(len(LANE_NAMES)))
        queued = sum(broker.llen(check_queue("local", lane)) for lane in LANE_NAMES)
        return leases == 0 and queued == 0

    wait_for(quiet, 30, interval=0.2, what="every run written back")
    runs = sum(j.runs for j in read_jobs(r, KEYS, jobs) if j)
    wait_for(
        lambda: scraped(f"{url}/metrics", "checkbeat_check_runs_total") == runs,
        10,
        interval=0.2,
        what=f"the scraped run count to equal the {runs} runs recorded",
    )
    assert scraped(f"{url}/metrics", "checkbeat_check_start_lateness_seconds_count") == runs
    assert scraped(f"{url}/metrics", "checkbeat_check_probe_duration_seconds_count") == runs
    pids = {int(m.group(1)) for f in mp.iterdir() if (m := re.search(r"_(\d+)\.db$", f.name))}
    children = pids - {worker.process.pid}
    assert len(children) >= 2, (pids, worker.process.pid)
