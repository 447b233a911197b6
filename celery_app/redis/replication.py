"""WAIT for replicas before acting on a write a failover must not lose.

Why: Redis replicates asynchronously. A cron window key (``cron_claim.lua``), a cron run key
(``cron_start.lua``), a check run's start (``run_start.lua``) or its completion
(``complete.lua``) acknowledged by a master that dies before its replica has it is gone once
Sentinel promotes that replica: the window is claimed and fired again, the run key no longer
stops a second delivery, the started or completed tick is claimed and run again.
``WAIT n timeout`` blocks until ``n`` replicas have every earlier write *of the same
connection*, so it is queued in the same pipeline as the script it protects.

On a shortfall (no replica acknowledged in ``CHECKBEAT_REDIS_WAIT_TIMEOUT``) checkbeat logs
and goes on: the replica is down or lagging, and refusing to fire until it returns would turn
one failed node into an outage of every schedule. After a shortfall the client skips WAIT for
``DEGRADED_S`` (right after a failover the new master has no replica at all, and every write
would stall for the timeout), then tries again. docs/high-availability.md explains the exposure
that leaves (the master must die within that lag).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from celery_app.redis.scripts import run_script
from celery_app.settings import Settings

log = logging.getLogger(__name__)

_WAIT_ATTR = "_checkbeat_wait"
_DEGRADED_ATTR = "_checkbeat_wait_skipped_until"
#: How long a client writes without WAIT after a shortfall before it waits again.
DEGRADED_S = 5.0
_shortfalls = 0
_lock = threading.Lock()


def wanted_replicas(settings: Settings, *, sentinel: bool) -> int:
    """``CHECKBEAT_REDIS_WAIT_REPLICAS``, with -1 meaning 1 under Sentinel and 0 otherwise."""
    wanted = settings.redis_wait_replicas
    if wanted < 0:
        return 1 if sentinel else 0
    return wanted


def mark_client(client: Any, settings: Settings, *, sentinel: bool) -> Any:
    """Remember on ``client`` how many replicas its protected writes wait for, and how long."""
    wanted = wanted_replicas(settings, sentinel=sentinel)
    timeout_ms = max(1, int(settings.redis_wait_timeout * 1000))
    setattr(client, _WAIT_ATTR, (wanted, timeout_ms))
    return client


def wait_policy(client: Any) -> tuple[int, int]:
    """(replicas, timeout ms) of ``client``; (0, 0) for a client checkbeat did not open."""
    return getattr(client, _WAIT_ATTR, (0, 0))


def queue_wait(pipe: Any, client: Any) -> bool:
    """Queue ``WAIT`` at the end of ``pipe`` if ``client`` asks for replicas; whether it did."""
    wanted, timeout_ms = wait_policy(client)
    if wanted <= 0 or getattr(client, _DEGRADED_ATTR, 0.0) > time.monotonic():
        return False
    pipe.wait(wanted, timeout_ms)
    return True


def took_wait(results: list[Any], queued: bool, client: Any, what: str) -> list[Any]:
    """``results`` without the WAIT's answer; a shortfall is logged and counted."""
    if not queued:
        return results
    if isinstance(results[-1], Exception):  # a pipeline run with raise_on_error=False
        raise results[-1]
    acked = int(results[-1])
    wanted, timeout_ms = wait_policy(client)
    if acked < wanted:
        global _shortfalls
        with _lock:
            _shortfalls += 1
        setattr(client, _DEGRADED_ATTR, time.monotonic() + DEGRADED_S)
        log.warning(
            "checkbeat: %s acknowledged by %d of %d replicas within %d ms; going on without "
            "WAIT for %.0f s (a failover now could lose writes)",
            what,
            acked,
            wanted,
            timeout_ms,
            DEGRADED_S,
        )
    return results[:-1]


def shortfalls() -> int:
    """WAITs of this process that timed out short of their replicas (tests, metrics)."""
    return _shortfalls


def run_replicated(
    client: Any, name: str, keys: Sequence[str], args: Sequence[Any], what: str
) -> Any:
    """``run_script(client, name, keys, args)``, then WAIT on the same connection; its answer.

    On a Redis Cluster (no WAIT: settings refuse replicas there) the script runs alone, so a
    NOSCRIPT after a failover or reshard is answered by redis-py loading it again."""
    if isinstance(client, RedisCluster):
        return run_script(client, name, keys, args)
    pipe = client.pipeline(transaction=False)
    run_script(pipe, name, keys, args)
    queued = queue_wait(pipe, client)
    return took_wait(pipe.execute(), queued, client, what)[0]
