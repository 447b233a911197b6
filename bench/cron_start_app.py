"""The cron start bench's project: a plain Celery app with checkbeat's beat scheduler and
``CRON_START_ENTRIES`` ``beat_schedule`` entries every second (epoch-anchored windows), each
firing ``bench.cron_started``, which records its window and when its body started."""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

STARTS_KEY = "bench:cron-starts"

app = Celery("bench-cron", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.beat_schedule = {
    f"every-second-{i}": {"task": "bench.cron_started", "schedule": 1.0}
    for i in range(int(os.environ.get("CRON_START_ENTRIES", "5")))
}
app.conf.worker_hijack_root_logger = False
_state: redis.Redis | None = None


@app.task(name="bench.cron_started", bind=True)
def cron_started(self) -> None:  # type: ignore[no-untyped-def]
    started = time.time()
    global _state
    if _state is None:
        _state = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
    window = getattr(self.request, "cron_window", None) or (self.request.headers or {}).get(
        "cron_window"
    )
    _state.rpush(STARTS_KEY, json.dumps({"window": window, "started_at": started}))
