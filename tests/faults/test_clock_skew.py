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
write-back of its result, Redis time). Also asserted: each lease expiry minus the lease length
(the claim's time) lies between the tick and the start, so claims and leases are on Redis's clock.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from clock_kinds import stamps
from faketime_env import faked, needs_faketime
from fault_procs import Processes, process_env
from support.partitions import suite_keys
from support.polling import wait_for

from celery_app.checks.run_contract import lease_seconds
from celery_app.checks.store import CheckStore
from celery_app.factory import settings_of
from celery_app.redis.clock import server_time
from scheduling_core import Params

pytestmark = [pytest.mark.faults, pytest.mark.timeout(150)]

HERE = Path(__file__).resolve().parent
KEYS = suite_keys("cbtest")
QUEUES = "checks.local.fast,checks.local.slow"

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


@dataclass
class Tally:
    """What the starts in the window and the recorded results say (times on Redis's clock)."""

    runs: int = 0
    misses: int = 0
    max_hold_s: float = 0.0
    per_check: dict[str, int] = field(default_factory=dict)
    # (uid, start - previous tick, tick - previous tick)
    duplicates: list[tuple[str, float, float]] = field(default_factory=list)
    early: list[tuple[str, float]] = field(default_factory=list)  # (uid, start - tick)
    # (uid, claim - tick, claim - start): a claim made, or a lease written, on a skewed clock
    bad_leases: list[tuple[str, float, float]] = field(default_factory=list)
    lost: list[dict] = field(default_factory=list)  # reaped while the run was live
    failed: list[dict] = field(default_factory=list)  # a probe broken in a skewed process


def tally(
    r: redis.Redis, everything: list[dict], uids: list[str], end: float, lease_s: float
) -> Tally:
    """Count the starts before ``end`` per check, and read each check's recorded results."""
    t = Tally()
    for uid in uids:
        mine = sorted(
            (s for s in everything if s["target"] == uid and s["server"] < end),
            key=lambda s: s["server"],
        )
        t.per_check[uid] = len(mine)
        t.runs += len(mine)
        for before, after in pairwise(mine):
            # from the earlier run's tick, not its start: a late start is no double run
            apart = after["server"] - before["sa"]
            ticks_apart = after["sa"] - before["sa"]
            if apart < PERIOD - 1 or ticks_apart < PERIOD - 1:
                t.duplicates.append((uid, round(apart, 3), round(ticks_apart, 3)))
        for s in mine:
            if s["server"] < s["sa"] - EARLY_TOLERANCE_S:
                t.early.append((uid, round(s["server"] - s["sa"], 3)))
            # the claim wrote lx = its time + lease_s: it must lie between the tick and the start
            claimed_at = s["lx"] - lease_s
            if not s["sa"] - EARLY_TOLERANCE_S <= claimed_at <= s["server"] + EARLY_TOLERANCE_S:
                t.bad_leases.append(
                    (uid, round(claimed_at - s["sa"], 3), round(claimed_at - s["server"], 3))
                )
        first_tick = mine[0]["sa"] if mine else end - OBSERVE_S + PERIOD
        allowed = 1 + math.floor((end - first_tick - LATE_SLACK_S) / PERIOD)
        t.misses += max(0, allowed - len(mine))
        recorded = write_backs(r, uid)
        t.lost += [res for _at, res in recorded if res["status"] == "lost"]
        t.failed += [res for _at, res in recorded if res["status"] not in ("up", "lost")]
        started = {round(s["sa"], 3): s["server"] for s in everything if s["target"] == uid}
        for written_at, res in recorded:
            tick = round(datetime.fromisoformat(res["scheduled_at"]).timestamp(), 3)
            if tick in started:  # the run of that tick: its start to its write-back
                t.max_hold_s = max(t.max_hold_s, written_at - started[tick])
    return t


def run_skewed(tmp_path, make_app, r, fault_report, scenario, beat_skew, worker_skews):
    needs_faketime()
    import clock_kinds  # noqa: F401 - the store validates the kind in this process

    app = make_app(check_timeout=3.0, lease_margin=0.5)
    env = process_env((HERE,), **ENV)
    procs = Processes(tmp_path, env)
    names = [f"skew{i}@clocks" for i in range(len(worker_skews))]
    try:
        for name, skew in zip(names, worker_skews, strict=True):
            slots = str(max(3, KEYS.partitions))  # a slot in every partition of the check half
            procs.worker("-P", "threads", "-c", slots, "-Q", QUEUES, "-n", name, **faked(skew, env))
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

    settings = settings_of(app)
    lease_s = lease_seconds(Params.from_settings(settings), settings.lease_margin)
    t = tally(r, everything, uids, created_at + OBSERVE_S, lease_s)
    fault_report.add(
        scenario,
        runs=t.runs,
        duplicates=len(t.duplicates),
        misses=t.misses,
        max_recovery_s=t.max_hold_s,
        early_starts=len(t.early),
        claims_off_the_server_clock=len(t.bad_leases),
        lost=len(t.lost),
        failed=len(t.failed),
        beat_skew_s=beat_skew,
        worker_skews_s=list(worker_skews),
        measured_offsets_s={k: round(v, 3) for k, v in offsets.items()},
        runs_per_check=sorted(set(t.per_check.values())),
        closest_duplicates=sorted(t.duplicates, key=lambda d: d[1])[:5],
        earliest_starts=sorted(t.early, key=lambda e: e[1])[:5],
    )
    assert not t.duplicates, t.duplicates[:10]
    assert not t.early, sorted(t.early, key=lambda e: e[1])[:10]
    assert not t.bad_leases, t.bad_leases[:10]
    assert not t.lost, t.lost[:3]
    assert not t.failed, t.failed[:3]
    assert t.misses == 0, t.per_check
    assert max(t.per_check.values()) <= math.ceil(OBSERVE_S / PERIOD) + 1, t.per_check


@pytest.mark.slow  # about 40 s of real processes: in CI's slow run
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
