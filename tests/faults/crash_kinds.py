"""A probe kind that records when it runs (the fault tests' witness of double runs).

``tracked`` appends ``{"ev": "start"|"end", "pid", "t", "target"}`` to the Redis list
``faulttest:probes`` around a busy wait of ``seconds`` (capped at the run's timeout). Loaded by
workers through ``CHECKBEAT_IMPORTS=crash_kinds`` with tests/faults on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import time

import redis

from celery_app.checks.kinds import check_kind

PROBES = "faulttest:probes"
_client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])


def _event(name: str, target: str) -> None:
    record = {"ev": name, "pid": os.getpid(), "t": time.time(), "target": target}
    _client.rpush(PROBES, json.dumps(record))


def validate_tracked(target: str, config: dict) -> dict:
    return {"seconds": float(config.get("seconds", 30.0))}


@check_kind("tracked", validate=validate_tracked)
def tracked(target: str, config: dict, context) -> bool:
    _event("start", target)
    end = time.monotonic() + min(config["seconds"], context.timeout_s)
    while time.monotonic() < end:
        time.sleep(0.01)
    _event("end", target)
    return True


def probe_events(client: redis.Redis) -> list[dict]:
    return [json.loads(e) for e in client.lrange(PROBES, 0, -1)]


def max_overlap(events: list[dict], killed: dict[int, float]) -> int:
    """Most probes running at once; a probe of a killed pid ends at its kill time."""
    intervals: list[list[float]] = []
    running: dict[int, list[int]] = {}  # pid -> indexes of its unfinished probes, oldest first
    for event in events:
        if event["ev"] == "start":
            running.setdefault(event["pid"], []).append(len(intervals))
            intervals.append([event["t"], float("inf")])
        elif running.get(event["pid"]):
            intervals[running[event["pid"]].pop(0)][1] = event["t"]
    for pid, indexes in running.items():
        for index in indexes:
            intervals[index][1] = killed.get(pid, float("inf"))
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in points:
        now += step
        peak = max(peak, now)
    return peak
