"""What the transition tests' workers load (CHECKBEAT_IMPORTS=transition_hooks): a check kind
that asks the target about its own region, and an ``@on_transition`` hook that records each
delivery in Redis (a start, then a completion) and can be told to block, so a test can kill the
worker while it delivers.
"""

from __future__ import annotations

import json
import os
import time

import redis
from support.hook_modules import delivery_record, regional

from celery_app import on_transition
from celery_app.checks.kinds import check_kind

#: Lists the hook appends to (test keys, outside checkbeat's prefix).
STARTS = "hooktest:starts"
DONE = "hooktest:done"
#: While this key exists the hook blocks (up to 60 s) before completing.
BLOCK = "hooktest:block"
#: The hook raises on the first FAIL_TIMES deliveries of each transition (counted per id).
FAIL_TIMES = "hooktest:fail-times"


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"], decode_responses=True)


check_kind("regional")(regional)


@on_transition
def record(transition) -> None:
    client = _redis()
    client.rpush(STARTS, json.dumps({"id": transition.id, "pid": os.getpid()}))
    if client.incr(f"hooktest:attempt:{transition.id}") <= int(client.get(FAIL_TIMES) or 0):
        raise RuntimeError(f"the hook fails on purpose for {transition.id}")
    deadline = time.monotonic() + 60
    while client.exists(BLOCK) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.rpush(DONE, delivery_record(transition, held=transition.held))
