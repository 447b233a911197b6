"""What the cluster partition test's workers load (CHECKBEAT_IMPORTS=cluster_hooks): a check kind
that asks the target about its own check and region, and an ``@on_transition`` hook that
records each delivery.

The records go to a plain Redis outside the deployment (``CLUSTERTEST_RECORD_URL``, the test's
own database), not to the cluster the test fails over: the witness must not share the fate of
what it witnesses.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import redis

from celery_app import on_transition
from celery_app.checks.kinds import check_kind

RECORD_ENV = "CLUSTERTEST_RECORD_URL"
#: The list every completed delivery is appended to.
DELIVERED = "clustertest:delivered"


@check_kind("cluster_regional")
def cluster_regional(target: str, config: dict, context) -> bool:
    """GET <target>/<region>: up on 200, down on anything else."""
    try:
        with urllib.request.urlopen(f"{target}/{context.region}", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


@on_transition
def record(transition) -> None:
    """Recorded only in the cluster test's workers: the pytest process imports this module
    too (collection), and a hook is every app's, so elsewhere it does nothing."""
    url = os.environ.get(RECORD_ENV)
    if not url:
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    client.rpush(
        DELIVERED,
        json.dumps(
            {
                "id": transition.id,
                "uid": transition.uid,
                "from": transition.from_state,
                "to": transition.to_state,
                "pid": os.getpid(),
            }
        ),
    )
    client.close()


def delivered(client: redis.Redis) -> list[dict]:
    """Every completed delivery, in order."""
    return [json.loads(x) for x in client.lrange(DELIVERED, 0, -1)]
