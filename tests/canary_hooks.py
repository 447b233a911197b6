"""What the canary test's processes load (CHECKBEAT_IMPORTS=canary_hooks): an ``@on_transition``
hook that keeps every payload it is given, whole, in a Redis list the test reads."""

from __future__ import annotations

import dataclasses
import json
import os

import redis

from celery_app import on_transition

#: The list the hook appends each transition to (a test key, outside checkbeat's prefix).
PAYLOADS = "canarytest:payloads"


@on_transition
def keep(transition) -> None:
    client = redis.Redis.from_url(os.environ["CHECKBEAT_REDIS_URL"], decode_responses=True)
    client.rpush(PAYLOADS, json.dumps(dataclasses.asdict(transition)))
