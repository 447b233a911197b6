"""Helper run as a subprocess by test_cron_processes: one cron engine ticking shared windows.

argv: engine name, number of engines, number of windows, the first window (ISO 8601: the
parent's ``support.cron.T0``, so every engine and the test agree on it). The engines meet at a
Redis barrier before each window; the last to arrive releases the in-flight keys (standing in for
workers finishing the runs). Prints a JSON count of what this engine fired.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta

import redis
from support.cron import make_engine

import celery_app
from celery_app.factory import settings_of
from celery_app.redis.schema import Keys


def main() -> None:
    name, engines, windows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start = datetime.fromisoformat(sys.argv[4])
    app = celery_app.app
    state = redis.Redis.from_url(settings_of(app).redis_url, decode_responses=True)
    engine = make_engine(app, start=start, owner=name)
    fired = 0
    for k in range(windows):
        if state.incr(f"test:barrier:{k}") == engines:
            for key in state.scan_iter(Keys(settings_of(app).key_prefix).cron_inflight("*", "*")):
                state.delete(key)
            state.set(f"test:go:{k}", 1)
        deadline = time.monotonic() + 30
        while not state.exists(f"test:go:{k}"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: barrier {k} timed out")
            time.sleep(0.005)
        fired += len(engine.tick(start + timedelta(minutes=k, seconds=1)).fired)
    print(json.dumps({"engine": name, "fired": fired}))


if __name__ == "__main__":
    main()
