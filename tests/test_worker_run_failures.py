"""A run task that raises, on a real worker process (threads pool; prefork too for the runs that
raise before their probe: the handler runs in the pool child) fed by the real dispatcher.

Before its probe (its check's stored config torn: the run raises after its start read found the
lease its own; or its check's hash replaced by a string: the start read itself fails, after it
took the started marker; both torn behind the store's back, with the jobs'
digest of the check's fields dropped so the run reads the check again) the run gives its lease
back at once and its job goes to its next tick: every tick of the check is either run once or
counted lost in the job (``JobField.ABANDONED``), none is left to the reaper (which would record
a lost run about 20 s later and skip the ticks in between), and the worker logs it and counts
it in ``checkbeat_check_runs_abandoned_total``. The same holds where ``time.sleep`` itself
fails (the worker under libfaketime's monotonic bug: ``OSError: [Errno 22]`` in the wait for the
tick of a run claimed ahead). After its probe (a user kind's result that cannot be built into an
outcome) the run is recorded, as an error naming the exception.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import pytest
from faults.faketime_env import FAKETIME_LIBS, MISSING, libfaketime
from prometheus_client.parser import text_string_to_metric_families
from support.checks import results
from support.partitions import suite_keys
from support.polling import wait_for
from support.processes import http_status, http_text

from celery_app.checks.jobs import JobState, read_job
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import free_port
from celery_app.redis.schema import CheckField, JobField, job_id

pytestmark = pytest.mark.slow

KEYS = suite_keys("cbtest")
REPO = Path(__file__).resolve().parent.parent
PERIOD = 2
WORKER_ENV = {
    "CHECKBEAT_IMPORTS": "custom_kinds",
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}
QUEUES = "checks.local.fast,checks.local.slow"


def start_worker(start_worker_process, pool: str = "threads"):
    """A check worker of region ``local`` with its metrics page: (process, URL)."""
    port = free_port()
    process = start_worker_process(
        *("-P", pool, "-c", "4", "-Q", QUEUES, "-n", "w@failures"),
        **WORKER_ENV,
        CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{port}",
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(f"{url}/healthz") == 200, 60, interval=0.2, what="the worker")
    return process, url


def job(r, uid: str) -> JobState:
    state = read_job(r, KEYS, job_id(uid, "local"))
    assert state is not None
    return state


def unix(iso: str) -> float:
    """A record's time (ISO 8601) as Unix seconds."""
    return datetime.fromisoformat(iso).timestamp()


def abandoned_series(url: str) -> dict[str, float]:
    """``checkbeat_check_runs_abandoned_total`` summed per reason."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(http_text(f"{url}/metrics")):
        for sample in family.samples:
            if sample.name == "checkbeat_check_runs_abandoned_total":
                reason = sample.labels["reason"]
                totals[reason] = totals.get(reason, 0.0) + sample.value
    return totals


def settle(r, ticker, uids: list[str]) -> None:
    """Stop dispatching and let the runs in flight finish."""
    ticker.stop()
    wait_for(lambda: all(job(r, u).lease_token is None for u in uids), 20, what="runs to finish")


def assert_every_tick_once(r, uid: str) -> tuple[JobState, list[dict]]:
    """From the check's first recorded tick to its next (unclaimed) one, every tick was run
    once or counted lost, and no run was left to the reaper."""
    state, runs = job(r, uid), results(r, KEYS, uid)
    ticks = [unix(run["scheduled_at"]) for run in runs]
    assert len(set(ticks)) == len(ticks), "a tick ran twice"
    assert all(run["status"] != "lost" for run in runs), "the reaper finished a run"
    # the ticks in [first, next): one per phase-aligned second (next_aligned carries the
    # sub-second part of its "now" over, so ticks are whole periods apart in whole seconds)
    seconds = math.floor(state.scheduled_at) - math.floor(ticks[0])
    assert seconds % PERIOD == 0, (ticks[0], state.scheduled_at)
    due = seconds // PERIOD
    assert state.runs == len(runs)
    assert len(runs) + state.abandoned == due, (uid, len(runs), state.abandoned, due)
    return state, runs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_run_that_raises_before_its_probe_frees_its_slot_and_its_next_tick_runs_on_time(
    r, make_app, start_worker_process, dispatching, pool
):
    import custom_kinds  # noqa: F401 - the store validates the user kind in this process

    process, url = start_worker(start_worker_process, pool)
    app = make_app()
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    uids = ["torn-config", "torn-check"]
    for uid in uids:
        store.create(uid=uid, tenant="t", kind="sleepy", target="x", period=PERIOD)
    ticker = dispatching(app, interval=0.05)
    wait_for(lambda: all(len(results(r, KEYS, u)) >= 2 for u in uids), 30, what="two runs each")
    # The hashes below are torn behind the store's back, so the jobs' digest of the check's
    # fields still names the copy the worker keeps: without it, each run reads the check again.
    for uid in uids:
        r.hdel(KEYS.job(job_id(uid, "local")), JobField.PROBE_DIGEST)

    # A stored config that is not a JSON object: the run raises once it has read its start.
    config_key = KEYS.check("torn-config")
    config = r.hget(config_key, CheckField.CONFIG)
    r.hset(config_key, CheckField.CONFIG, "[1]")
    # The check's hash a string: the start read fails (WRONGTYPE) after taking the marker.
    check_key = KEYS.check("torn-check")
    dumped = r.dump(check_key)
    r.set(check_key, "torn")
    wait_for(lambda: all(job(r, u).abandoned >= 1 for u in uids), 4 * PERIOD, what="abandons")
    r.hset(config_key, CheckField.CONFIG, config)
    r.restore(check_key, 0, dumped, replace=True)
    counts = {u: len(results(r, KEYS, u)) for u in uids}
    wait_for(
        lambda: all(len(results(r, KEYS, u)) >= counts[u] + 3 for u in uids),
        8 * PERIOD,
        what="three runs each after the repair",
    )
    settle(r, ticker, uids)

    for uid in uids:
        state, runs = assert_every_tick_once(r, uid)
        assert state.abandoned >= 1 and all(run["status"] == "up" for run in runs)
        # the runs after the lost ticks started on their tick, not a lease later
        assert all(
            unix(run["started_at"]) - unix(run["scheduled_at"]) < PERIOD / 2 for run in runs[-3:]
        )
    log = process.output()
    assert "run of torn-config@local raised before its probe (ValueError: " in log
    assert "before-probe): lease released, its tick" in log
    assert "run of torn-check@local raised before its probe (ResponseError: " in log
    assert "start-read): lease released, its tick" in log
    abandoned = abandoned_series(url)
    assert abandoned == {
        "before-probe": job(r, "torn-config").abandoned,
        "start-read": job(r, "torn-check").abandoned,
    }


@pytest.mark.timeout(90)
def test_a_run_that_raises_after_its_probe_is_recorded(
    r, make_app, start_worker_process, dispatching
):
    import custom_kinds  # noqa: F401 - the store validates the user kind in this process

    process, url = start_worker(start_worker_process)
    app = make_app()
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="malformed", tenant="t", kind="malformed", target="x", period=PERIOD)
    ticker = dispatching(app, interval=0.05)
    wait_for(lambda: len(results(r, KEYS, "malformed")) >= 3, 8 * PERIOD, what="three runs")
    settle(r, ticker, ["malformed"])

    state, runs = assert_every_tick_once(r, "malformed")
    assert state.abandoned == 0
    for run in runs:
        assert (run["status"], run["error_class"]) == ("down", "error")
        assert run["error"].startswith("the run failed after its probe: ValueError: dictionary")
        assert run["started_at"] and run["worker"] and run["queue"]
    assert "run of malformed@local raised after its probe (ValueError: " in process.output()
    assert abandoned_series(url) == {"before-probe": 0.0, "start-read": 0.0}


@pytest.mark.timeout(120)
@pytest.mark.skipif(not FAKETIME_LIBS, reason=MISSING)
def test_a_tick_wait_whose_sleep_raises_gives_every_claimed_tick_back_at_once(
    r, make_app, start_worker_process, dispatching
):
    """libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 makes every ``time.sleep`` fail
    with ``OSError: [Errno 22]`` (tests/faults/faketime_shim says why): a run claimed within the
    dispatch lead raises in its wait for the tick."""
    import custom_kinds  # noqa: F401 - the store validates the user kind in this process

    lead = {"CHECKBEAT_DISPATCH_LEAD": "0.5"}
    broken_sleep = libfaketime(0)
    port = free_port()
    process = start_worker_process(
        # a slot in every partition of the check half
        *("-P", "threads", "-c", str(max(2, KEYS.partitions)), "-Q", QUEUES, "-n", "w@sleepless"),
        **WORKER_ENV, **lead, **broken_sleep, CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{port}",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(f"{url}/healthz") == 200, 60, interval=0.2, what="the worker")
    app = make_app(dispatch_lead=0.5)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="sleepless", tenant="t", kind="sleepy", target="x", period=PERIOD)
    first = job(r, "sleepless").scheduled_at
    ticker = dispatching(app, interval=0.05)
    wait_for(lambda: job(r, "sleepless").abandoned >= 3, 8 * PERIOD, what="three abandons")
    settle(r, ticker, ["sleepless"])

    state = job(r, "sleepless")
    seconds = math.floor(state.scheduled_at) - math.floor(first)
    assert seconds % PERIOD == 0
    assert state.runs + state.abandoned == seconds // PERIOD  # every tick: run or counted lost
    assert all(run["status"] != "lost" for run in results(r, KEYS, "sleepless"))
    assert (
        "(OSError: [Errno 22] Invalid argument, before-probe): lease released" in process.output()
    )
    assert abandoned_series(url)["before-probe"] == state.abandoned
