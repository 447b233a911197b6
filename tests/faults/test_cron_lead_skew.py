"""Cron windows fired ahead (``CHECKBEAT_CRON_LEAD``) by two beat replicas, run by workers whose
wall clocks are 2 s ahead and 2 s behind: every window runs exactly once, and no body starts
before its window on Redis's clock.

Real processes (``fault_procs.Processes``): two beats and two threads workers, each worker (and
in the slow variant both beats, +0.5 s: they fire 0.55 s early) skewed with libfaketime
(``faketime_env``; skipped with the reason when it is missing). Redis is not skewed, so its
``TIME`` is the real time every start is judged on. A worker that waited on its own clock would
start the windows it got up to the lead early (the one ahead) or 2 s late (the one behind); one
that did not wait at all would start every window up to the lead early.

Three runtime schedules every second (epoch-anchored windows); each body records its window and
the Redis time and worker time at its start (``leadskew.stamp``). A beat ahead by more than a
window (here 1 s) would make these singletons skip every other window as in flight: the previous
window's run still waits for its start when the next one fires (docs/faults.md, known limits).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from faketime_env import FAKETIME_LIBS, faked
from fault_procs import Processes, process_env
from support.partitions import suite_keys
from support.polling import wait_for

from celery_app.cron_tasks.registration import GLOBAL_TENANT, interval_window_id
from celery_app.cron_tasks.runtime import add_schedule
from celery_app.redis.clock import server_time
from celery_app.redis.schema import CronStateField

pytestmark = [pytest.mark.faults, pytest.mark.timeout(150)]

HERE = Path(__file__).resolve().parent
KEYS = suite_keys("cbtest")
STAMPS = "faulttest:lead-stamps"
SCHEDULES = [f"lead{i}" for i in range(3)]
BEHIND = {"behind@lead": -2.0}
SKEWS = {"ahead@lead": 2.0, **BEHIND}
SETTLE_S = 3.0  # Redis time from both workers' first runs to the observation
OBSERVE_S = 8.0
SKEW_TOLERANCE_S = 0.3

TASKS = f"""
import json
import os
import socket
import time

import redis
from celery import shared_task

from celery_app.cron_tasks.recording import claim_run

_client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])


@shared_task(bind=True, name="leadskew.stamp")
def stamp(self):
    sec, usec = _client.time()
    worker = time.time()
    if not claim_run(self.request):
        return
    headers = self.request.headers or {{}}
    record = {{
        "task": getattr(self.request, "cron_task", None) or headers.get("cron_task"),
        "window": getattr(self.request, "cron_window", None) or headers.get("cron_window"),
        "server": sec + usec / 1e6,
        "worker": worker,
        "host": self.request.hostname,
    }}
    _client.rpush("{STAMPS}", json.dumps(record))
"""


def _skipped(r: redis.Redis) -> dict[str, int]:
    """Windows each schedule skipped behind a run still in flight, so far (its state)."""
    return {
        task: int(r.hget(KEYS.cron_state(task, GLOBAL_TENANT), CronStateField.SKIPPED) or 0)
        for task in SCHEDULES
    }


def _stamps(r: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in r.lrange(STAMPS, 0, -1)]


@pytest.mark.slow
def test_windows_fired_ahead_run_once_and_never_early_on_skewed_workers(
    tmp_path, make_app, r, broker_url, fault_report
):
    run_lead(tmp_path, make_app, r, broker_url, fault_report, 0.0, SKEWS)


@pytest.mark.slow
def test_a_beat_half_a_second_ahead_fires_early_and_its_windows_still_start_on_time(
    tmp_path, make_app, r, broker_url, fault_report
):
    run_lead(tmp_path, make_app, r, broker_url, fault_report, 0.5, {"even@lead": 0.0, **BEHIND})


def run_lead(tmp_path, make_app, r, broker_url, fault_report, beat_skew, skews):
    if not FAKETIME_LIBS:
        pytest.skip("libfaketime is not installed (apt-get install faketime; .ci/run installs it)")
    redis.Redis.from_url(broker_url).flushdb()
    (tmp_path / "lead_skew_tasks.py").write_text(textwrap.dedent(TASKS))
    app = make_app()
    lead = app.conf.checkbeat_settings.cron_lead
    assert lead > 0
    env = process_env((tmp_path,), CHECKBEAT_IMPORTS="lead_skew_tasks")
    procs = Processes(tmp_path, env)
    fired_ahead: list[float] = []  # last window - last claim time, sampled from the state
    try:
        for name, skew in skews.items():
            procs.worker("-P", "threads", "-c", "4", "-Q", "celery", "-n", name, **faked(skew, env))
        for schedule in SCHEDULES:
            # the task is in lead_skew_tasks, imported by the worker processes only
            add_schedule(app, schedule, task="leadskew.stamp", every="1s", remote_task=True)
        procs.beat(**faked(beat_skew, env))
        procs.beat(**faked(beat_skew, env))
        wait_for(
            lambda: {s["host"] for s in _stamps(r)} >= set(skews),
            60,
            interval=0.1,
            what="both workers to run a window",
        )
        # From a little later: a worker's first runs (connections, script loads) may take a
        # second, and a singleton's next window is then rightly skipped as in flight.
        begin = server_time(r) + SETTLE_S
        state = KEYS.cron_state(SCHEDULES[0], GLOBAL_TENANT)
        skipped_before = _skipped(r)

        def sample() -> bool:
            window, sent = r.hmget(state, CronStateField.LAST_WINDOW, CronStateField.LAST_SENT_AT)
            if window and sent:
                fired_ahead.append(float(window) - float(sent))
            return server_time(r) >= begin + OBSERVE_S

        wait_for(sample, SETTLE_S + OBSERVE_S + 10, interval=0.05, what="the observation window")
    finally:
        procs.stop_all()

    skipped = {task: n - skipped_before.get(task, 0) for task, n in _skipped(r).items()}
    stamps = _stamps(r)
    starts = {(s["task"], s["window"]): s for s in stamps}
    runs = Counter((s["task"], s["window"]) for s in stamps)
    twice = [key for key, n in runs.items() if n > 1]
    early = [
        (key, round(s["server"] - datetime.fromisoformat(key[1]).timestamp(), 4))
        for key, s in starts.items()
        if s["server"] < datetime.fromisoformat(key[1]).timestamp()
    ]
    # every window of every schedule inside the observation ran (none lost to the wait)
    expected = {
        (task, interval_window_id(datetime.fromtimestamp(second, UTC)))
        for task in SCHEDULES
        for second in range(int(begin) + 1, int(begin + OBSERVE_S) - 1)
    }
    missing = sorted(expected - set(runs))
    # a window is lost only if neither run nor recorded as skipped behind a run still in flight
    # (a singleton fired ahead on a loaded machine may find the previous run unfinished)
    lost = {
        task: n
        for task in SCHEDULES
        if (n := sum(1 for t, _w in missing if t == task)) > skipped.get(task, 0)
    }
    late_by_host = {
        host: [
            s["server"] - datetime.fromisoformat(s["window"]).timestamp()
            for s in stamps
            if s["host"] == host and (s["task"], s["window"]) in expected
        ]
        for host in skews
    }
    late = [t for host_late in late_by_host.values() for t in host_late]
    offsets = {
        host: statistics.median(s["worker"] - s["server"] for s in stamps if s["host"] == host)
        for host in skews
    }
    fault_report.add(
        f"cron lead: 2 beats {beat_skew:+g} s, workers "
        + " and ".join(f"{skew:+g} s" for skew in skews.values()),
        runs=len(stamps),
        duplicates=len(twice),
        early_starts=len(early),
        misses=sum(lost.values()),
        skipped_in_flight=sum(skipped.values()),
        fired_ahead_ms=sorted(round(a * 1000, 1) for a in set(fired_ahead)),
        late_p50_ms=round(statistics.median(late) * 1000, 1) if late else None,
        late_max_ms=round(max(late) * 1000, 1) if late else None,
        measured_offsets_s={k: round(v, 3) for k, v in offsets.items()},
    )
    for host, skew in skews.items():  # the skew took effect
        assert offsets[host] == pytest.approx(skew, abs=SKEW_TOLERANCE_S), offsets
    # (claim times are on beat's clock, as the windows it fires; a sample may also pair a
    # window skipped in flight with the previous one's claim time)
    assert any(0 < a <= lead + 0.01 for a in fired_ahead), "beat never fired within the lead"
    assert not twice, twice[:10]
    assert not early, sorted(early, key=lambda e: e[1])[:10]
    assert not lost, (lost, skipped, missing[:10])
    # No worker waited on its own clock: one waiting on a clock 2 s behind would start every run
    # it gets 2 s late. Its typical start is within the lead, and none is as late as the skew (a
    # loaded machine's stall may delay a few runs of either worker by over a second).
    behind = abs(next(iter(BEHIND.values())))
    assert all(late_by_host[host] for host in BEHIND), late_by_host
    for host, host_late in late_by_host.items():
        if host_late:
            assert statistics.median(host_late) < 0.5, (host, sorted(host_late))
            assert max(host_late) < behind - SKEW_TOLERANCE_S, (host, sorted(host_late))
