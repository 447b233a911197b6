"""The failover test's witnesses, kept on a Redis that does not fail over (``HA_WITNESS_URL``).

``hatracked`` is a short probe kind; every run of ``checkbeat.run_check`` that got past the
lease check (not discarded) appends ``{"job", "sa", "t"}`` to ``hatest:checkruns``, so two runs
of one (job, scheduled tick) are a double run. Cron task bodies append to ``hatest:cronruns``.
Loaded by workers through ``CHECKBEAT_IMPORTS`` with tests/faults on PYTHONPATH. The run
witness is connected only where ``HA_WITNESS_URL`` names the witness Redis (those workers): the
test modules import this one too, and a handler left in the pytest process would run after every
in-process worker's runs of the rest of the suite.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.signals import task_postrun

from celery_app.checks.kinds import check_kind

CHECK_RUNS = "hatest:checkruns"
CRON_RUNS = "hatest:cronruns"
WITNESS_ENV = "HA_WITNESS_URL"
_client = redis.Redis.from_url(os.environ.get(WITNESS_ENV, "redis://127.0.0.1:1/0"))


@check_kind("hatracked")
def hatracked(target: str, config: dict, context) -> bool:
    time.sleep(0.01)
    return True


def _witness_check_run(sender: Any = None, kwargs: Any = None, retval: Any = None, **_: Any):
    if getattr(sender, "name", None) != "checkbeat.run_check" or not isinstance(kwargs, dict):
        return
    if isinstance(retval, dict) and "discarded" in retval:
        return
    record = {"job": kwargs.get("job_id"), "sa": kwargs.get("scheduled_at"), "t": time.time()}
    _client.rpush(CHECK_RUNS, json.dumps(record))


if os.environ.get(WITNESS_ENV):
    task_postrun.connect(_witness_check_run, weak=False)


def witness_cron_run(task_id: str, window: str) -> None:
    _client.rpush(CRON_RUNS, json.dumps({"task": task_id, "window": window, "t": time.time()}))


def check_runs(client: redis.Redis) -> list[dict]:
    return [json.loads(e) for e in client.lrange(CHECK_RUNS, 0, -1)]


def cron_runs(client: redis.Redis) -> list[dict]:
    return [json.loads(e) for e in client.lrange(CRON_RUNS, 0, -1)]
