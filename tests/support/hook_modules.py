"""What the modules the tests' workers load by ``CHECKBEAT_IMPORTS`` (``transition_hooks``,
``cluster_hooks``) share: a probe that asks the target about its own region, and a delivered
transition as the JSON record their ``@on_transition`` hooks append to Redis.

Each module registers the probe under its own kind name, so a test's check names the module it
needs its workers to load.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


def regional(target: str, config: dict, context: Any) -> bool:
    """GET <target>/<region>: up on 200, down on anything else."""
    try:
        with urllib.request.urlopen(f"{target}/{context.region}", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def delivery_record(transition: Any, **extra: object) -> str:
    """The transition a hook was handed (id, uid, from, to, ``extra``) and the process that ran
    it, as one JSON line."""
    return json.dumps(
        {
            "id": transition.id,
            "uid": transition.uid,
            "from": transition.from_state,
            "to": transition.to_state,
            **extra,
            "pid": os.getpid(),
        }
    )
