"""A probe kind that stamps each start with Redis's clock (the clock-skew test's witness).

``stamped`` reads, in one round trip, the job's scheduled tick (``sa``) and lease expiry
(``lx``) and the server's ``TIME``, and appends ``{"target", "sa", "lx", "server", "worker",
"skew", "pid"}`` to the Redis list ``faulttest:stamps``: ``server`` is the real time of the
start (Redis is never skewed), ``worker`` the worker's own (possibly faked) ``time.time()``,
``skew`` the worker's ``FAKETIME``. Then it busy-waits ``seconds``. Loaded by workers through
``CHECKBEAT_IMPORTS=clock_kinds`` with tests/faults on PYTHONPATH; the check's target is its uid.
"""

from __future__ import annotations

import json
import os
import time

import redis

from celery_app.checks.kinds import check_kind
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import job_id
from celery_app.settings import load_settings
from workers.deadline import honours_deadline

STAMPS = "faulttest:stamps"
_client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"], decode_responses=True)
_keys = state_keys(load_settings())  # the process's prefix and partitions


def validate_stamped(target: str, config: dict) -> dict:
    return {"seconds": float(config.get("seconds", 0.1))}


@check_kind("stamped", validate=validate_stamped)
@honours_deadline  # its loop ends by the deadline: the runner calls it inline
def stamped(target: str, config: dict, context) -> bool:
    pipe = _client.pipeline(transaction=False)
    pipe.hmget(_keys.job(job_id(target, context.region)), "sa", "lx")
    pipe.time()
    (sa, lx), (sec, usec) = pipe.execute()
    record = {
        "target": target,
        "sa": float(sa) if sa else None,
        "lx": float(lx) if lx else None,
        "server": sec + usec / 1e6,
        "worker": time.time(),
        "skew": os.environ.get("FAKETIME", ""),
        "pid": os.getpid(),
    }
    _client.rpush(STAMPS, json.dumps(record))
    end = time.monotonic() + min(config["seconds"], context.timeout_s)
    while time.monotonic() < end:
        time.sleep(0.01)
    return True


def stamps(client: redis.Redis) -> list[dict]:
    return [json.loads(e) for e in client.lrange(STAMPS, 0, -1)]
