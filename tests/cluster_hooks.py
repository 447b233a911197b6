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

import redis
from support.hook_modules import delivery_record, regional

from celery_app import on_transition
from celery_app.checks.kinds import check_kind

RECORD_ENV = "CLUSTERTEST_RECORD_URL"
#: The list every completed delivery is appended to.
DELIVERED = "clustertest:delivered"


check_kind("cluster_regional")(regional)


@on_transition
def record(transition) -> None:
    """Recorded only in the cluster test's workers: the pytest process imports this module
    too (collection), and a hook is every app's, so elsewhere it does nothing."""
    url = os.environ.get(RECORD_ENV)
    if not url:
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    client.rpush(DELIVERED, delivery_record(transition))
    client.close()


def delivered(client: redis.Redis) -> list[dict]:
    """Every completed delivery, in order."""
    return [json.loads(x) for x in client.lrange(DELIVERED, 0, -1)]
