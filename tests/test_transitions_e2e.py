"""End to end with real processes: two ``celery beat`` and two workers per region, a target on
127.0.0.1 that fails on command per region, an ``@on_transition`` hook that records every
delivery (tests/transition_hooks.py), and the tenant's signed webhook notification target on a
receiver on 127.0.0.1.

What is proved: a region goes down only after ``failure_threshold`` failures and comes back
after ``success_threshold`` successes; the check follows the region quorum; every transition is
delivered to the hook and sent to the notification target exactly once, also when the worker
delivering it is killed mid-hook.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support.checks import results
from support.flip_server import FlipServer
from support.partitions import count_in, suite_keys
from support.polling import wait_for
from support.workers import REPO, worker_env

from celery_app.checks.check_state import read_transitions
from celery_app.checks.jobs import read_job
from celery_app.checks.notify import NotifyStore, read_outcomes, validate_target
from celery_app.checks.store import CheckStore
from celery_app.settings import load_settings

KEYS = suite_keys("cbtest")
REGIONS = ("eu", "us")
HOOK_QUEUE = "cbtest.transitions"
ENV = {
    "CHECKBEAT_REGIONS": ",".join(REGIONS),
    "CHECKBEAT_IMPORTS": "transition_hooks",
    "CHECKBEAT_TRANSITION_QUEUE": HOOK_QUEUE,
    "CHECKBEAT_ALLOW_PRIVATE_TARGETS": "1",  # the notification receiver is on 127.0.0.1
    "CHECKBEAT_TRANSITION_TIMEOUT": "3",
    "CHECKBEAT_DISPATCH_INTERVAL": "0.2",
    "CHECKBEAT_CHECK_TIMEOUT": "3",
    "CHECKBEAT_LEASE_MARGIN": "1",
    "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
}
FAILURES, SUCCESSES = 2, 2
SECRET = "e2e-signing-secret-0123"


def notify_tenant(r, receiver) -> None:
    """The tenant's checks' transitions go to ``receiver``'s /e2e, signed."""
    url = f"checkbeat+webhook://127.0.0.1:{receiver.port}/e2e?secret={SECRET}"
    NotifyStore(r, KEYS).add(validate_target(tenant="acme", url=url, target_id="e2e"))


def notified(receiver) -> Counter:
    """How many times each transition reached the receiver."""
    return Counter(json.loads(x.body)["id"] for x in receiver.got("/e2e"))


@pytest.fixture
def system(r, broker, tmp_path: Path, start_worker_process):
    """Two beats, two workers per region (each also consumes the hook queue), the target."""
    import transition_hooks

    beats: list[subprocess.Popen] = []
    with FlipServer() as target:
        for n in range(2):
            log = (tmp_path / f"beat-{n}.log").open("wb")
            beats.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "celery_app",
                        "beat",
                        "-l",
                        "INFO",
                        "-s",
                        str(tmp_path / f"beat-{n}-schedule"),
                    ],
                    cwd=tmp_path,
                    env=worker_env(**ENV),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        workers = {}
        for region in REGIONS:
            for n in range(2):
                name = f"w{n}-{region}@e2e"
                queues = f"checks.{region}.fast,checks.{region}.slow,{HOOK_QUEUE}"
                workers[name] = start_worker_process(
                    "-P", "threads", "-c", "4", "-Q", queues, "-n", name, **ENV
                )
        for name in workers:
            wait_for(lambda n=name: r.exists(KEYS.worker(n)), 60, what=f"worker {name}")
        settings = load_settings(regions=list(REGIONS))
        yield {
            "target": target,
            "store": CheckStore(r, KEYS, settings),
            "workers": workers,
            "hooks": transition_hooks,
        }
        for beat in beats:
            beat.send_signal(signal.SIGTERM)
        for beat in beats:
            try:
                beat.wait(15)
            except subprocess.TimeoutExpired:
                beat.kill()
                beat.wait(5)


def add(store, uid: str, target: str, **extra) -> None:
    store.create(
        uid=uid,
        tenant="acme",
        kind="regional",
        target=target,
        period=1,
        regions=list(REGIONS),
        failure_threshold=FAILURES,
        success_threshold=SUCCESSES,
        **extra,
    )


def transitions(r, uid: str) -> list[dict]:
    return list(reversed(read_transitions(r, KEYS.check_transitions(uid), count=100)))


def delivered(r, hooks) -> list[dict]:
    return [json.loads(x) for x in r.lrange(hooks.DONE, 0, -1)]


def runs(r, uid: str, region: str) -> int:
    job = read_job(r, KEYS, f"{uid}@{region}")
    return job.runs if job else 0


def state(r, uid: str) -> str:
    return r.hget(KEYS.check_state(uid), "s") or "up"


@pytest.mark.timeout(180)
def test_thresholds_quorum_and_one_delivery_per_transition(r, system, http_receiver):
    target, store, hooks = system["target"], system["store"], system["hooks"]
    notify_tenant(r, http_receiver)
    add(store, "majority", target.url)  # quorum: 2 of 2 regions
    add(store, "any", target.url, quorum=1)
    wait_for(lambda: runs(r, "majority", "eu") >= 3 and runs(r, "any", "us") >= 3, 60,
             what="healthy runs")  # fmt: skip
    assert transitions(r, "majority") == transitions(r, "any") == []

    # one region fails: "any" goes down after exactly FAILURES failures, "majority" stays up
    target.fail("eu")
    wait_for(lambda: state(r, "any") == "down", 30, what="'any' down")
    down = transitions(r, "any")[0]
    # the run that made it is the region's last result the transition records
    made_by = _ts(down["regions"]["eu"]["result"]["finished_at"])
    failed_before = [
        row for row in results(r, KEYS, "any", "eu")
        if row["status"] == "down" and _ts(row["finished_at"]) <= made_by
    ]  # fmt: skip
    assert len(failed_before) == FAILURES
    assert down["regions"]["eu"]["state"] == "down" and down["regions"]["us"]["state"] == "up"
    eu_runs = runs(r, "majority", "eu")
    wait_for(lambda: runs(r, "majority", "eu") >= eu_runs + 3, 30, what="more failed runs")
    assert read_job(r, KEYS, "majority@eu").health.state == "down"
    assert state(r, "majority") == "up" and transitions(r, "majority") == []

    # the second region fails too: the quorum is reached
    target.fail("us")
    wait_for(lambda: state(r, "majority") == "down", 30, what="'majority' down")
    # both recover after SUCCESSES successes
    target.heal("eu", "us")
    wait_for(lambda: state(r, "majority") == "up" and state(r, "any") == "up", 30,
             what="recovery")  # fmt: skip
    # "majority" is up again as soon as one region is (1 down < quorum 2): that region had
    # SUCCESSES successes since the check went down
    first_down, up = transitions(r, "majority")
    recovered = [g for g in REGIONS if up["regions"][g]["state"] == "up"]
    assert recovered
    for region in recovered:
        went_down = _ts(first_down["regions"][region]["result"]["finished_at"])
        came_up = _ts(up["regions"][region]["result"]["finished_at"])
        ok_since = [
            row for row in results(r, KEYS, "majority", region)
            if row["status"] == "up" and went_down < _ts(row["finished_at"]) <= came_up
        ]  # fmt: skip
        assert len(ok_since) >= SUCCESSES

    made = [t["id"] for uid in ("majority", "any") for t in transitions(r, uid)]
    assert [(t["from"], t["to"]) for t in transitions(r, "majority")] == [
        ("up", "down"),
        ("down", "up"),
    ]
    assert len(made) == 4
    wait_for(lambda: len(delivered(r, hooks)) >= 4, 30, what="every delivery")
    wait_for(
        lambda: count_in(r, KEYS, lambda k: k.transition_outbox()) == 0, 30, what="an empty outbox"
    )
    counts = Counter(d["id"] for d in delivered(r, hooks))
    assert counts == Counter(made)  # each transition delivered once, none twice
    assert max(counts.values()) == 1
    assert notified(http_receiver) == Counter(made)  # and sent to the tenant's target once


@pytest.mark.timeout(180)
def test_a_worker_killed_while_delivering_does_not_lose_or_repeat_it(r, system, http_receiver):
    target, store, hooks, workers = (
        system["target"],
        system["store"],
        system["hooks"],
        system["workers"],
    )
    r.set(hooks.BLOCK, "1")
    notify_tenant(r, http_receiver)
    add(store, "kill", target.url, quorum=1)
    wait_for(lambda: runs(r, "kill", "eu") >= 2, 60, what="healthy runs")
    target.fail("eu")
    wait_for(lambda: r.llen(hooks.STARTS) == 1, 60, what="the delivery to start")
    started = json.loads(r.lindex(hooks.STARTS, 0))
    (victim,) = [w for w in workers.values() if w.process.pid == started["pid"]]
    victim.kill()  # SIGKILL mid-hook: no ack, no finish
    r.delete(hooks.BLOCK)
    # its lease lapses (3 s limit + 2 s), a beat publishes it again, another worker delivers
    wait_for(lambda: len(delivered(r, hooks)) == 1, 60, what="the redelivery")
    (done,) = delivered(r, hooks)
    assert done["id"] == started["id"] == "kill#1"
    assert done["pid"] != victim.process.pid
    assert r.llen(hooks.STARTS) == 2  # started twice, completed once
    target.heal("eu")
    wait_for(lambda: len(delivered(r, hooks)) == 2, 60, what="the recovery delivered")
    wait_for(
        lambda: count_in(r, KEYS, lambda k: k.transition_outbox()) == 0, 30, what="an empty outbox"
    )
    assert Counter(d["id"] for d in delivered(r, hooks)) == Counter({"kill#1": 1, "kill#2": 1})
    # the target was sent to before the hook blocked: the redelivery did not send it again
    assert notified(http_receiver) == Counter({"kill#1": 1, "kill#2": 1})
    assert read_outcomes(r, KEYS, "kill#1")["e2e"].attempts == 1
    assert os.environ.get("CHECKBEAT_KEY_PREFIX") == "cbtest"


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.slow  # a real one-minute window on the wall clock: ~85 s, a tenth of the default run
@pytest.mark.timeout(240)
def test_a_transition_inside_a_window_is_held_and_delivered_at_its_end(r, system):
    from datetime import UTC, datetime, timedelta

    from celery_app.checks.maintenance import MaintenanceStore, validate_window

    target, store, hooks = system["target"], system["store"], system["hooks"]
    add(store, "maint", target.url, quorum=1)
    # a one-minute window in the coming minute (or this one, when enough of it is left)
    now = datetime.now(UTC)
    start = now.replace(second=0, microsecond=0)
    if now.second > 30:
        start += timedelta(minutes=1)
    window = validate_window(
        uid="maint", cron=f"{start.minute} {start.hour} * * *", duration=60, timezone="UTC"
    )
    MaintenanceStore(r, KEYS).add(window)
    wait_for(lambda: datetime.now(UTC) >= start, 45, what="the window to open")
    target.fail("eu")
    wait_for(lambda: r.hget(KEYS.check_state("maint"), "o") == "down", 30, what="down, held")
    assert r.hexists(KEYS.check_state("maint"), "hu")
    assert transitions(r, "maint") == [] and delivered(r, hooks) == []
    assert results(r, KEYS, "maint", "eu")[-1]["maintenance"] is True
    # still down when the window closes: beat delivers it then, once, marked as held
    end = start + timedelta(seconds=60)
    wait_for(lambda: len(delivered(r, hooks)) == 1, 60, what="the delivery at the window's end")
    (made,) = transitions(r, "maint")
    assert made["held"] is True and made["to"] == "down"
    assert made["at"] >= end.timestamp() - 0.5
    (done,) = delivered(r, hooks)
    assert (done["id"], done["held"]) == ("maint#1", True)


@pytest.mark.timeout(180)
def test_a_hook_that_raises_is_retried_by_the_queue_and_completes_once(r, system):
    target, store, hooks = system["target"], system["store"], system["hooks"]
    r.set(hooks.FAIL_TIMES, "2")
    add(store, "retry", target.url, quorum=1)
    wait_for(lambda: runs(r, "retry", "eu") >= 2, 60, what="healthy runs")
    target.fail("eu")
    # two raising attempts (Celery retries after 1 s, then 2 s), then the delivery completes
    wait_for(lambda: len(delivered(r, hooks)) == 1, 60, what="the retried delivery")
    (done,) = delivered(r, hooks)
    assert done["id"] == "retry#1"
    assert [json.loads(x)["id"] for x in r.lrange(hooks.STARTS, 0, -1)] == ["retry#1"] * 3
    wait_for(
        lambda: count_in(r, KEYS, lambda k: k.transition_outbox()) == 0, 30, what="an empty outbox"
    )
    assert not r.hexists(KEYS.of_transition("retry#1").transition_failed(), "retry#1")
