"""Three beat replicas, one SIGKILLed at a random point of every window and restarted: every
singleton (task, tenant, window) still runs exactly once (a kill between claim and publish is
taken over by a surviving beat).

The beats run on the test clock (``CHECKBEAT_TEST_CLOCK``, docs/cron-tasks.md) at RATE times
real speed, so ten one-minute windows take ten times 60/RATE real seconds. A real worker runs
the tasks (a singleton whose previous run is still in flight is skipped, so runs must finish);
each run is recorded (``support.run_witness``), which is what is counted.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from fault_procs import Processes, ahead_clock, clocked_env
from support.partitions import suite_keys
from support.polling import wait_for
from support.run_witness import run_counts

from celery_app.cron_tasks.registration import GLOBAL_TENANT, window_id, window_start
from celery_app.redis.schema import CronStatsField

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

KEYS = suite_keys("cbtest")
SINGLETONS = 12
TENANTS = [f"t{i}" for i in range(4)]
RATE = 30.0  # one window = 2 real seconds
WINDOWS = 10
GRACE_S = 120  # simulated seconds (4 real): slack for a loaded CI machine

TASKS = f"""
from celery_app import cron
from support.run_witness import witnessed


for i in range({SINGLETONS}):
    cron("* * * * *", id=f"s{{i}}", name=f"faults.s{{i}}", bind=True)(witnessed(f"s{{i}}"))
cron("* * * * *", id="fan", name="faults.fan", per_tenant=True, bind=True)(witnessed("fan"))
"""


class HeartbeatWatch:
    """Notes when each beat pid first heartbeats (the moment a restarted replica is back)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.first_seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            now = time.monotonic()
            for beat_id in self.client.hkeys(KEYS.beat_heartbeat()):
                pid = int(beat_id.split(":")[-2])
                self.first_seen.setdefault(pid, now)

    def __enter__(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _expected(window: datetime) -> list[tuple[str, str, str]]:
    wid = window_id(window)
    return [(f"s{i}", GLOBAL_TENANT, wid) for i in range(SINGLETONS)] + [
        ("fan", t, wid) for t in TENANTS
    ]


def test_three_beats_one_sigkilled_every_window_fire_each_singleton_once(
    tmp_path, r, broker_url, fault_report
):
    redis.Redis.from_url(broker_url).flushdb()
    r.sadd(KEYS.tenants(), *TENANTS)
    clock = ahead_clock(RATE)
    start = clock.start  # the simulated instant at clock.epoch (real time)
    window_real = 60.0 / RATE
    procs = Processes(
        tmp_path,
        clocked_env(tmp_path, clock, "fault_cron_tasks", TASKS, CHECKBEAT_CRON_GRACE=str(GRACE_S)),
    )
    rng = random.Random()
    kills: list[tuple[int, int, float]] = []  # (killed pid, replacement pid, when)
    try:
        with HeartbeatWatch(r) as watch:
            procs.worker("-P", "threads", "-c", "8", "-Q", "celery")
            beats = [procs.beat() for _ in range(3)]
            wait_for(
                lambda: all(b.pid in watch.first_seen for b in beats),
                30,
                what="three beats to heartbeat",
            )
            # Judge the windows from the second after all three are up: the first may still see
            # the start-up catch-up runs in flight, and a singleton whose previous run is in
            # flight is skipped by design (docs/cron-tasks.md, Overlap).
            first = window_start(clock.now()) + timedelta(minutes=2)
            last = first + timedelta(minutes=WINDOWS - 1)
            for k in range(WINDOWS):
                real_start = (
                    clock.epoch + (first + timedelta(minutes=k) - start).total_seconds() / RATE
                )
                kill_at = real_start + rng.uniform(0.02, 0.98) * window_real
                wait_for(lambda t=kill_at: time.time() >= t, 2 * window_real + 10)
                victim = beats[k % 3]
                # High availability means one replica up: never kill the last live one (on a
                # loaded machine a replacement may take longer than a window to start).
                wait_for(
                    lambda v=victim: any(
                        b is not v and b.alive() and b.pid in watch.first_seen for b in beats
                    ),
                    30,
                    what="another live beat before the kill",
                )
                victim.kill()
                beats[k % 3] = procs.beat()
                kills.append((victim.pid, beats[k % 3].pid, time.monotonic()))
            # Every window's grace has passed, with the last replacement up: all catch-up done.
            done_at = last + timedelta(minutes=1, seconds=GRACE_S + 1)
            wait_for(lambda: clock.now() > done_at, 60, what="the last window's grace to pass")
            wait_for(lambda: beats[-1].pid in watch.first_seen, 30, what="the last restart")
            broker = redis.Redis.from_url(broker_url)
            wait_for(
                lambda: (
                    broker.llen("celery") == 0
                    and not list(r.scan_iter(KEYS.cron_inflight("*", "*")))
                ),
                30,
                what="the worker to finish every run",
            )
            recoveries = [
                watch.first_seen[new] - at for _old, new, at in kills if new in watch.first_seen
            ]
    finally:
        procs.stop_all()

    counts = run_counts(r)
    duplicates = {key: n for key, n in counts.items() if n > 1}
    judged = [key for k in range(WINDOWS) for key in _expected(first + timedelta(minutes=k))]
    missed = [key for key in judged if counts[key] == 0]
    # A SIGKILL that lands between a beat's claim (SET NX) and its publish is taken over by a
    # surviving beat once the claim's lease ends: nothing is lost, nothing runs twice.
    never_published = _claimed_never_published(r)
    fault_report.add(
        "beat: 3 replicas, SIGKILL one per window",
        runs=len(judged),
        duplicates=sum(n - 1 for n in duplicates.values()),
        misses=len(missed),
        max_recovery_s=max(recoveries),
        kills=len(kills),
        lost_between_claim_and_publish=len([k for k in missed if k in never_published]),
        taken_over=sum(
            int(r.hget(KEYS.cron_stats(task), CronStatsField.TAKEN_OVER) or 0)
            for task in [f"s{i}" for i in range(SINGLETONS)] + ["fan"]
        ),
    )
    assert len(recoveries) == WINDOWS
    assert not duplicates, f"fired more than once: {duplicates}"
    skip_reasons = {
        key: r.hget(KEYS.cron_state(key[0], key[1]), "last_skip_reason") for key in missed
    }
    assert not missed, f"never fired: {missed[:10]} {skip_reasons}"


def _claimed_never_published(r: redis.Redis) -> set[tuple[str, str, str]]:
    members: set[tuple[str, str, str]] = set()
    for raw in r.hvals(KEYS.cron_pending()):
        members.update(tuple(m.split("|")) for m in json.loads(raw)["members"])
    for raw in r.lrange(KEYS.cron_gaps(), 0, -1):
        gap = json.loads(raw)
        if "never published" in gap["detector"]:
            start = datetime.fromtimestamp(gap["from"], UTC)
            members.add((gap["task"], gap.get("tenant", GLOBAL_TENANT), window_id(start)))
    return members
