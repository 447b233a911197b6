"""One job whose data breaks a dispatch step is quarantined; every other job in every region runs.

Real worker processes (one per region), real dispatcher ticks, real Redis. Four jobs are torn by
writing their hashes directly, each breaking a different step: promote (a non-numeric effective
deadline, a Lua error), claim (a non-numeric cost), the worker's post-exec write (a run count
that is no integer, a Lua error) and the reaper (a period too large to parse, on an expired
lease). No tick raises, the others all run, the four are listed by ``checks diagnose`` with the
step and the reason, and an update (one of them) and ``checks reconcile`` (the rest) rebuild
them so they run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner
from support.partitions import members_in, suite_keys
from support.polling import wait_for

from celery_app.checks.jobs import from_unix
from celery_app.checks.quarantine import read_quarantine
from celery_app.checks.store import CheckStore
from celery_app.cli.checks import checks
from celery_app.redis.schema import JobField, QuarantineStep, job_id, split_job_id

pytestmark = pytest.mark.faults

KEYS = suite_keys("cbtest")
REPO = Path(__file__).resolve().parents[2]
REGIONS = ["eu", "us"]
WORKER_ENV = {
    "CHECKBEAT_IMPORTS": "custom_kinds",
    "CHECKBEAT_REGIONS": ",".join(REGIONS),
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}
N = 6  # checks, each in both regions: 12 jobs

#: job -> (the field torn, its value, the step that must set it aside)
TORN = {
    job_id("c0", "eu"): (JobField.EFFECTIVE_AT, "not-a-time", QuarantineStep.PROMOTE),
    job_id("c1", "us"): (JobField.COST_EWMA_MS, "bogus", QuarantineStep.CLAIM),
    job_id("c2", "eu"): (JobField.RUNS, "many", QuarantineStep.POST_EXEC),  # torn mid-run
    job_id("c3", "us"): (JobField.PERIOD, "1" + "0" * 400, QuarantineStep.REAP),
    job_id("c4", "eu"): (JobField.RUNS, "many", QuarantineStep.RUN),
}
SLOW_RUN_S = 2.0  # c2's probe: long enough to tear its hash while it runs


def runs(r, job: str) -> int:
    value = r.hget(KEYS.job(job), JobField.RUNS)
    return int(value) if value and value.isdigit() else 0


def diagnose(app) -> tuple[int, str]:
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    result = CliRunner().invoke(checks, ["diagnose", "--json"], obj=obj, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.timeout(120)
def test_torn_jobs_are_quarantined_and_every_other_job_runs(
    r, make_app, start_worker_process, dispatching, fault_report, tmp_path
):
    import custom_kinds  # noqa: F401 - the store validates the user kind in this process

    app = make_app(regions=REGIONS)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    started = tmp_path / "c2-started"
    created = from_unix(time.time() - 70)  # every job is due at once
    for i in range(N):
        store.create(
            uid=f"c{i}",
            tenant="acme",
            kind="announced" if i == 2 else "sleepy",
            target=str(started) if i == 2 else "x",
            config={"seconds": SLOW_RUN_S if i == 2 else 0.01},
            period=60,
            regions=["eu"] if i == 2 else REGIONS,  # c2's file: touched by its one job
            now=created,
        )
    for job, (field, value, step) in TORN.items():
        if step == QuarantineStep.POST_EXEC:
            continue
        r.hset(KEYS.job(job), field, value)
        if step == QuarantineStep.REAP:  # claimed long ago, its worker gone: the lease expired
            expired = time.time() - 100
            r.hset(
                KEYS.job(job), mapping={JobField.LEASE_TOKEN: "1.1", JobField.LEASE_EXPIRY: expired}
            )
            r.zrem(KEYS.of_job(job).due(), job)
            r.zadd(KEYS.of_job(job).leases("us", 0), {job: expired})
    for region in REGIONS:
        start_worker_process(
            "--role", "shared", "--region", region, "-P", "threads", "-n", f"q-{region}@t",
            **WORKER_ENV,
        )  # fmt: skip
    hosts = [KEYS.worker(f"q-{region}@t") for region in REGIONS]
    wait_for(lambda: r.exists(*hosts) == len(hosts), 30, what="both workers registered")
    ticker = dispatching(app, interval=0.1)
    torn_mid_run = job_id("c2", "eu")
    wait_for(started.exists, 30, what="c2's probe started (its job read by the worker)")
    field, value, _ = TORN[torn_mid_run]
    r.hset(KEYS.job(torn_mid_run), field, value)
    every = [j for d in store.list() for j in d.job_ids()]
    healthy = [j for j in every if j not in TORN]

    def settled() -> bool:
        quarantined = members_in(r, KEYS, lambda k: k.quarantine())
        return all(runs(r, j) >= 1 for j in healthy) and len(quarantined) == len(TORN)

    wait_for(settled, 60, what="every healthy job run and every torn one quarantined")
    assert ticker.error is None, ticker.error
    ticks = ticker.ticks
    wait_for(lambda: ticker.ticks >= ticks + 5, 10, what="more ticks after the quarantine")
    assert ticker.error is None, ticker.error

    quarantined = {q.job_id: q for q in read_quarantine(r, KEYS)}
    assert set(quarantined) == set(TORN)
    for job, (_field, _value, step) in TORN.items():
        assert quarantined[job].step == step, (job, quarantined[job])
        assert quarantined[job].reason and quarantined[job].at > 0
        # out of every index, no lease: nothing claims it again
        home = KEYS.of_job(job)
        assert r.zscore(home.due(), job) is None
        for lane in (0, 1):
            region = split_job_id(job)[1]
            for key in (home.ready(region, lane), home.leases(region, lane)):
                assert r.zscore(key, job) is None
        assert not r.hexists(KEYS.job(job), JobField.LEASE_TOKEN)
    code, out = diagnose(app)
    report = json.loads(out)
    assert code == 1
    quarantined = {f["subject"]: f for f in report if f["kind"] == "quarantined"}
    assert set(quarantined) == set(TORN), report
    assert "c0@eu quarantined by promote" in quarantined["c0@eu"]["message"]
    assert quarantined["c0@eu"]["since"]

    # Release: an update of c0 rebuilds its job; reconcile rebuilds the rest.
    store.update("c0", period=10)  # placed at its next aligned tick: within 10 s
    assert not r.sismember(KEYS.of_check("c0").quarantine(), "c0@eu")
    assert not r.hexists(KEYS.job("c0@eu"), JobField.QUARANTINE)
    wait_for(lambda: runs(r, "c0@eu") >= 1, 20, what="c0@eu runs after the update")
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    result = CliRunner().invoke(checks, ["reconcile"], obj=obj, catch_exceptions=False)
    assert f"{len(TORN) - 1} quarantined job(s) rebuilt" in result.output, result.output
    assert members_in(r, KEYS, lambda k: k.quarantine()) == set()
    # rebuilt at their next aligned tick (within a period): due again, healthy hashes
    for job in set(TORN) - {"c0@eu"}:
        assert r.zscore(KEYS.of_job(job).due(), job) is not None
        assert not r.hexists(KEYS.job(job), JobField.QUARANTINE)
    code, out = diagnose(app)
    assert [f for f in json.loads(out) if f["kind"] == "quarantined"] == []
    ticker.stop()
    ticks_run = [
        (j, json.loads(f["result"])["scheduled_at"])
        for j in healthy
        for _id, f in r.xrange(KEYS.results(split_job_id(j)[0]))
        if json.loads(f["result"])["region"] == split_job_id(j)[1]
    ]
    duplicates = len(ticks_run) - len(set(ticks_run))
    assert duplicates == 0, sorted(ticks_run)
    fault_report.add(
        "torn job data (promote, claim, run, post-exec, reap)",
        runs=sum(runs(r, j) for j in healthy),
        duplicates=duplicates,
        misses=sum(1 for j in healthy if runs(r, j) == 0),
        quarantined=len(quarantined),
        tick_errors=0,
    )
