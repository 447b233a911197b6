"""The cron start bench's project: a plain Celery app with checkbeat's beat scheduler and
``CRON_START_ENTRIES`` ``beat_schedule`` entries every second (whole-second windows), each
firing ``bench.cron_started``, which records its window and when its body started.

Its workers import checkbeat's cron-run recording (``imports``), as an installed app's do: the
run key is written before the body, as in production. With ``CRON_START_PROFILE=1`` beat and
the worker also stamp each stage of a window (beat woke, claimed, published; the worker
received the message, ran the prerun handlers), so the bench can say where the time goes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun, task_received

STARTS_KEY = "bench:cron-starts"
#: Per window fired by beat (profile only): when beat woke for it, claimed and published it.
BEAT_STAMPS_KEY = "bench:cron-beat"
#: Per delivery (profile only): when the worker received it and when its prerun began.
WORKER_STAMPS_KEY = "bench:cron-worker"
PROFILE = os.environ.get("CRON_START_PROFILE") == "1"

app = Celery("bench-cron", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.beat_schedule = {
    f"every-second-{i}": {"task": "bench.cron_started", "schedule": 1.0}
    for i in range(int(os.environ.get("CRON_START_ENTRIES", "5")))
}
app.conf.imports = ("celery_app.cron_tasks.recording",)
app.conf.worker_hijack_root_logger = False
_state: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _state
    if _state is None:
        _state = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"])
    return _state


def _window_of(request: Any) -> str | None:
    return getattr(request, "cron_window", None) or (getattr(request, "headers", None) or {}).get(
        "cron_window"
    )


@app.task(name="bench.cron_started", bind=True)
def cron_started(self) -> None:
    started = time.time()
    record = {"window": _window_of(self.request), "started_at": started, "id": self.request.id}
    _redis().rpush(STARTS_KEY, json.dumps(record))


_received: dict[str, float] = {}


def _on_received(request: Any = None, **_: Any) -> None:
    _received[request.id] = time.time()


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    record = {
        "id": task_id,
        "window": _window_of(task.request),
        "received": _received.pop(task_id or "", None),
        "prerun": time.time(),
    }
    _redis().rpush(WORKER_STAMPS_KEY, json.dumps(record))


def _profile_beat() -> None:
    """Wrap beat's tick, claim and publish to stamp each window they handle."""
    from beat.scheduler import CronScheduler
    from celery_app.cron_tasks.cron_state import CronStore
    from celery_app.cron_tasks.sender import CronPublisher

    woke: list[float] = [0.0]
    claimed: list[float] = [0.0]
    tick, claim, publish = CronScheduler._tick, CronStore.claim, CronPublisher.publish

    def timed_tick(self: Any) -> float:
        woke[0] = time.time()
        return tick(self)

    def timed_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = claim(self, *args, **kwargs)
        claimed[0] = time.time()
        return answer

    def timed_publish(self: Any, requests: Any, **kwargs: Any) -> Any:
        ids = publish(self, requests, **kwargs)
        done = time.time()
        stamps = [
            json.dumps(
                {"window": r.window_id, "woke": woke[0], "claimed": claimed[0], "published": done}
            )
            for r in requests
        ]
        if stamps:
            _redis().rpush(BEAT_STAMPS_KEY, *stamps)
        return ids

    CronScheduler._tick = timed_tick
    CronStore.claim = timed_claim
    CronPublisher.publish = timed_publish


if PROFILE:
    if "beat" in sys.argv:
        _profile_beat()
    else:
        # Connected at import, before the recording module's handler (imported later, with the
        # app's imports): the prerun stamp is taken before the run key is written.
        task_received.connect(_on_received, weak=False)
        task_prerun.connect(_on_prerun, weak=False)
