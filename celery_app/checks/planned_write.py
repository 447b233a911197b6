"""The post-exec write in one round trip, planned from what the run read when it started.

Why: the write needs the job, Redis's time and the maintenance version, and reading them first
would cost a round trip of its own before ``complete.lua``. The run already read the job and
the maintenance version, with Redis's time, a moment before its probe, and nothing but its own
completion changes a leased job, so the worker plans the write from that read (the server's
time advanced by the worker's monotonic clock since) and ``complete.lua`` checks, atomically,
that the job and the maintenance version are still as read (``jobs.ReadGuard``). When they are
not (an edit, a pause, a quorum transition, a window changed during the run) it writes nothing
and the caller reads again and plans again (:func:`~celery_app.checks.jobs.finish_run_with_health`).
The refill's reads (``dispatch.RefillNeeds``) ride on the same round trip, after the write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from celery_app.checks.jobs import CompletedRun, ReadGuard, completion_reply, queue_complete
from celery_app.redis.replication import queue_wait, took_wait
from celery_app.redis.schema import Keys

#: complete.lua's reply when its guard found the job or the maintenance windows changed.
STALE = -1


def complete_as_read(
    client: redis.Redis,
    keys: Keys,
    run: CompletedRun,
    guard: ReadGuard,
    *,
    results_maxlen: int,
    then: Callable[[Any], None] | None = None,
) -> tuple[tuple[bool, str | None] | None, list[Any]]:
    """Write ``run`` if the job and the maintenance version are as ``guard`` read them, and
    queue ``then(pipe)``'s reads after it, in one round trip. ((written, transition id or
    None), or None when the guard refused; the replies of ``then``'s reads)."""
    pipe = client.pipeline(transaction=False)
    queue_complete(pipe, keys, run, results_maxlen, guard)
    if then is not None:
        then(pipe)
    # Replicated before the slot is refilled: a completion lost in a failover runs its tick again.
    queued = queue_wait(pipe, client)
    reply, *reads = took_wait(pipe.execute(), queued, client, "a check completion")
    if reply == STALE:
        return None, reads
    return completion_reply(reply), reads
