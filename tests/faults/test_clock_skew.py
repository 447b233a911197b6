"""Beat and workers whose wall clocks disagree: no check runs twice for a tick, none starts
before its tick, no live run is reaped, and every check runs as often as its period allows.

Real processes: a beat and check workers as ``celery`` subprocesses, each skewed with
libfaketime (``LD_PRELOAD`` + ``FAKETIME=-2`` etc.; the Debian package ``faketime``, which
``.ci/run`` installs; the test is skipped with the reason when it is missing).
``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves Celery's timers alone: only the wall clock lies.
Redis is not skewed, so its ``TIME`` is the real time every measurement is made on.

libfaketime 0.9.10 breaks ``time.sleep`` in such a process (see faketime_shim/sitecustomize.py,
put on the skewed processes' PYTHONPATH).

The probe is ``clock_kinds.stamped``: each start records the job's scheduled tick, the server's
time and the worker's own time, so the test also checks that the skew took effect (as does each
process's heartbeat, written on its own clock).

Row: ``runs`` probe starts in the window, ``duplicates`` runs that started (Redis time), or were
scheduled, less than period - 1 s after the previous run's tick of the same check, ``misses`` ticks
the period allowed that did not run, ``recovery_s`` the longest slot hold (probe start to the
write-back of its result, Redis time).
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from clock_kinds import stamps
from conftest import wait_for
from fault_procs import Processes, process_env

from celery_app.checks.store import CheckStore
from celery_app.redis.clock import server_time
from celery_app.redis.schema import Keys

pytest_plugins = ["fault_report", "worker_fixtures"]
pytestmark = [pytest.mark.faults, pytest.mark.timeout(150)]

HERE = Path(__file__).resolve().parent
SHIM = HERE / "faketime_shim"
KEYS = Keys("cbtest")
QUEUES = "checks.local.fast,checks.local.slow"
FAKETIME_LIBS = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))

CHECKS = 20
PERIOD = 10
OBSERVE_S = 40.0  # Redis time from the checks' creation
RUN_S = 0.3  # each probe's busy wait
EARLY_TOLERANCE_S = 0.05
LATE_SLACK_S = 2.5  # a tick may start this late on a loaded 2-core machine and still count
SKEW_TOLERANCE_S = 0.3
ENV = {
    "CHECKBEAT_IMPORTS": "clock_kinds",
    "CHECKBEAT_CHECK_TIMEOUT": "3",
    "CHECKBEAT_LEASE_MARGIN": "0.5",
}


def faked(skew: float, base: dict[str, str]) -> dict[str, str]:
    """What to add to ``base`` (a process environment) to run it ``skew`` s off the real wall
    clock: libfaketime, and the ``time.sleep`` shim its monotonic bug needs (faketime_shim)."""
    if not skew:
        return {}
    return {
        "LD_PRELOAD": FAKETIME_LIBS[0],
        "FAKETIME": f"{skew:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join([str(SHIM), base["PYTHONPATH"]]),
    }


def reported_offsets(r: redis.Redis, sources: dict[str, tuple[str, str]]) -> dict[str, float]:
    """For each name -> (hash, field) holding a process's heartbeat time on its own clock: that
    time minus Redis's time, read right after the heartbeat changes (polled every 10 ms)."""
    first = {name: r.hget(*where) for name, where in sources.items()}
    offsets: dict[str, float] = {}

    def all_changed() -> bool:
        for name, where in sources.items():
            if name in offsets:
                continue
            pipe = r.pipeline(transaction=False)
            pipe.hget(*where)
            pipe.time()
            value, (sec, usec) = pipe.execute()
            if value is not None and value != first[name]:
                offsets[name] = float(value) - (sec + usec / 1e6)
        return len(offsets) == len(sources)

    wait_for(all_changed, 15, interval=0.01, what="every process to write a fresh heartbeat")
    return offsets


def write_backs(r: redis.Redis, uid: str) -> list[tuple[float, dict]]:
    """(Redis time of the write-back, result) of each recorded run, oldest first."""
    return [
        (int(entry_id.split("-")[0]) / 1000, json.loads(fields["result"]))
        for entry_id, fields in r.xrange(KEYS.results(uid))
    ]


def run_skewed(tmp_path, make_app, r, fault_report, scenario, beat_skew, worker_skews):
    if not FAKETIME_LIBS:
        pytest.skip("libfaketime is not installed (apt-get install faketime; .ci/run installs it)")
    import clock_kinds  # noqa: F401 - the store validates the kind in this process

    app = make_app(check_timeout=3.0, lease_margin=0.5)
    env = process_env((HERE,), **ENV)
    procs = Processes(tmp_path, env)
    names = [f"skew{i}@clocks" for i in range(len(worker_skews))]
    try:
        for name, skew in zip(names, worker_skews, strict=True):
            procs.worker("-P", "threads", "-c", "3", "-Q", QUEUES, "-n", name, **faked(skew, env))
        procs.beat(**faked(beat_skew, env))
        wait_for(
            lambda: all(r.exists(KEYS.worker(n)) for n in names) and r.hlen(KEYS.beat_heartbeat()),
            60,
            what="the workers to register and beat to start",
        )
        (beat_id,) = r.hkeys(KEYS.beat_heartbeat())

        created_at = server_time(r)
        store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
        uids = [f"skew{i:02d}" for i in range(CHECKS)]
        for uid in uids:
            store.create(
                uid=uid, tenant="t", kind="stamped", target=uid,
                config={"seconds": RUN_S}, period=PERIOD,
            )  # fmt: skip

        # The skew took effect: each process's heartbeat is written on its own, faked clock.
        sources = {n: (KEYS.worker(n), "heartbeat") for n in names}
        sources["beat"] = (KEYS.beat_heartbeat(), beat_id)
        offsets = reported_offsets(r, sources)
        for name, skew in [*zip(names, worker_skews, strict=True), ("beat", beat_skew)]:
            assert offsets[name] == pytest.approx(skew, abs=SKEW_TOLERANCE_S), offsets

        end = created_at + OBSERVE_S
        wait_for(lambda: server_time(r) >= end, OBSERVE_S + 10, interval=0.2, what="the window")
    finally:
        procs.stop_all()  # beat first (the last started): no new claims, then warm shutdowns

    everything = stamps(r)
    # ... and the probes saw it too: worker time minus Redis time at each start.
    for skew in set(worker_skews):
        label = faked(skew, env).get("FAKETIME", "")
        seen = [s["worker"] - s["server"] for s in everything if s["skew"] == label]
        assert seen, f"no run on the worker skewed {skew:+g} s"
        assert statistics.median(seen) == pytest.approx(skew, abs=SKEW_TOLERANCE_S)

    runs = duplicates = misses = early = 0
    max_hold = 0.0
    per_check: dict[str, int] = {}
    lost: list[dict] = []
    failed: list[dict] = []  # a probe that broke in the skewed process (e.g. time.sleep)
    closest_dup: list[tuple[str, float, float]] = []
    earliest: list[tuple[str, float]] = []
    for uid in uids:
        mine = sorted(
            (s for s in everything if s["target"] == uid and s["server"] < end),
            key=lambda s: s["server"],
        )
        per_check[uid] = len(mine)
        runs += len(mine)
        for before, after in pairwise(mine):
            # from the earlier run's tick, not its start: a late start is no double run
            apart = after["server"] - before["sa"]
            ticks_apart = after["sa"] - before["sa"]
            if apart < PERIOD - 1 or ticks_apart < PERIOD - 1:
                duplicates += 1
                closest_dup.append((uid, round(apart, 3), round(ticks_apart, 3)))
        for s in mine:
            if s["server"] < s["sa"] - EARLY_TOLERANCE_S:
                early += 1
                earliest.append((uid, round(s["server"] - s["sa"], 3)))
        first_tick = mine[0]["sa"] if mine else created_at + PERIOD
        allowed = 1 + math.floor((end - first_tick - LATE_SLACK_S) / PERIOD)
        misses += max(0, allowed - len(mine))
        recorded = write_backs(r, uid)
        lost += [res for _at, res in recorded if res["status"] == "lost"]
        failed += [res for _at, res in recorded if res["status"] not in ("up", "lost")]
        started = {round(s["sa"], 3): s["server"] for s in everything if s["target"] == uid}
        for written_at, res in recorded:
            tick = round(datetime.fromisoformat(res["scheduled_at"]).timestamp(), 3)
            if tick in started:  # the run of that tick: its start to its write-back
                max_hold = max(max_hold, written_at - started[tick])

    fault_report.add(
        scenario,
        runs=runs,
        duplicates=duplicates,
        misses=misses,
        max_recovery_s=max_hold,
        early_starts=early,
        lost=len(lost),
        failed=len(failed),
        beat_skew_s=beat_skew,
        worker_skews_s=list(worker_skews),
        measured_offsets_s={k: round(v, 3) for k, v in offsets.items()},
        runs_per_check=sorted(set(per_check.values())),
        closest_duplicates=sorted(closest_dup, key=lambda d: d[1])[:5],
        earliest_starts=sorted(earliest, key=lambda e: e[1])[:5],
    )
    assert duplicates == 0, closest_dup[:10]
    assert early == 0, sorted(earliest, key=lambda e: e[1])[:10]
    assert not lost, lost[:3]
    assert not failed, failed[:3]
    assert misses == 0, per_check
    allowed_max = math.ceil(OBSERVE_S / PERIOD) + 1
    assert max(per_check.values()) <= allowed_max, per_check


def test_workers_two_seconds_behind_and_ahead_of_beat_run_each_tick_once_and_never_early(
    tmp_path, make_app, r, fault_report
):
    run_skewed(tmp_path, make_app, r, fault_report, "clocks: workers -2 s and +2 s", 0.0, (-2, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "beat_skew", "worker_skews"),
    [
        ("clocks: workers -0.8 s (the reported case)", 0.0, (-0.8, -0.8)),
        ("clocks: beat +2 s, workers 0 and -2 s", 2.0, (0.0, -2.0)),
    ],
)
def test_skewed_beat_and_workers_run_each_tick_once_and_never_early(
    tmp_path, make_app, r, fault_report, scenario, beat_skew, worker_skews
):
    run_skewed(tmp_path, make_app, r, fault_report, scenario, beat_skew, worker_skews)
