"""WAIT for replicas before acting on a write a failover must not lose.

Why: Redis replicates asynchronously. A cron window key (``cron_claim.lua``), a cron run key
(``cron_start.lua``), a check run's start (its started marker) or its completion
(``complete.lua``) acknowledged by a master that dies before its replica has it is gone once
Sentinel promotes that replica: the window is claimed and fired again, the run key no longer
stops a second delivery, the started or completed tick is claimed and run again.
``WAIT n timeout`` blocks until ``n`` replicas have every earlier write *of the same
connection*, so it is queued in the same pipeline as the write it protects.

On a shortfall (no replica acknowledged in ``CHECKBEAT_REDIS_WAIT_TIMEOUT``) checkbeat logs
and goes on: the replica is down or lagging, and refusing to fire until it returns would turn
one failed node into an outage of every schedule. After a shortfall the client skips WAIT for
``DEGRADED_S`` (right after a failover the new master has no replica at all, and every write
would stall for the timeout), then tries again. docs/high-availability.md explains the exposure
that leaves (the master must die within that lag).

On a Redis Cluster the same holds per node: a pipeline's writes go to the masters that own
their slots, each over one connection, and a WAIT is queued for each of those masters, bound to
its slot (``celery_app/redis/cluster.py`` sends it on that connection, after the writes). The
shortfall's skip is per master there: a promoted replica without a replica of its own does not
turn WAIT off for the other masters. A write that redis-py had to send again on its own (a
MOVED, an ASK, a connection lost in a failover) is not covered by any WAIT: it counts as a
shortfall. By default a cluster write waits for one replica on each master that has one
connected (:data:`PER_MASTER`), and for none on a master without: a cluster failover promotes
a replica, so one that lags must not lose a started tick, and a cluster without replicas (a
development one) must not stall every write for the timeout. Each master is asked (``ROLE``)
at most every :data:`REPLICAS_CHECKED_S`: a client's slot table cannot say, as it lists the
replicas the node it asked knew when it asked (none, for a client that started with the
cluster).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import NoScriptError
from redis.utils import str_if_bytes

from celery_app.redis.cluster import WaitingPipeline
from celery_app.redis.scripts import run_script
from celery_app.settings import Settings

log = logging.getLogger(__name__)

_WAIT_ATTR = "_checkbeat_wait"
_DEGRADED_ATTR = "_checkbeat_wait_skipped_until"
#: How long a client writes without WAIT after a shortfall before it waits again.
DEGRADED_S = 5.0
#: The replicas a cluster client waits for by default: one on each master that has a replica
#: connected, none on the others.
PER_MASTER = -1
#: How long a cluster client trusts what a master said of its replicas before asking again.
REPLICAS_CHECKED_S = 10.0
_REPLICAS_ATTR = "_checkbeat_master_replicas"
_shortfalls = 0
_lock = threading.Lock()


def wanted_replicas(settings: Settings, *, sentinel: bool, cluster: bool = False) -> int:
    """``CHECKBEAT_REDIS_WAIT_REPLICAS``, with -1 meaning 1 under Sentinel, 1 on each master
    that has a replica on a cluster (:data:`PER_MASTER`), and 0 on a plain Redis (it has no
    replica)."""
    wanted = settings.redis_wait_replicas
    if wanted < 0:
        return 1 if sentinel else PER_MASTER if cluster else 0
    return wanted


def mark_client(client: Any, settings: Settings, *, sentinel: bool, cluster: bool = False) -> Any:
    """Remember on ``client`` how many replicas its protected writes wait for, and how long."""
    wanted = wanted_replicas(settings, sentinel=sentinel, cluster=cluster)
    timeout_ms = max(1, int(settings.redis_wait_timeout * 1000))
    setattr(client, _WAIT_ATTR, (wanted, timeout_ms))
    setattr(client, _DEGRADED_ATTR, {})
    setattr(client, _REPLICAS_ATTR, {})
    return client


def wait_policy(client: Any) -> tuple[int, int]:
    """(replicas, timeout ms) of ``client``; (0, 0) for a client checkbeat did not open.
    Replicas :data:`PER_MASTER`: one on each master with a replica (a cluster's default)."""
    return getattr(client, _WAIT_ATTR, (0, 0))


def may_wait(client: Any) -> bool:
    """Whether a protected write of ``client`` may queue a WAIT (whether it does is
    :func:`queue_wait`'s to say, per master)."""
    return wait_policy(client)[0] != 0


def _has_replica(client: Any, node: Any) -> bool:
    """Whether the cluster master ``node`` has a replica connected, as it said (``ROLE``) at
    most :data:`REPLICAS_CHECKED_S` ago. A master that does not answer, or refuses (``ROLE`` is
    in ACL category @admin), is taken to have one: the write that follows goes to it too, and a
    WAIT that falls short is a shortfall."""
    known: dict[str, tuple[float, bool]] = getattr(client, _REPLICAS_ATTR, {})
    now = time.monotonic()
    seen = known.get(node.name)
    if seen is not None and seen[0] > now:
        return seen[1]
    try:
        role = client.execute_command("ROLE", target_nodes=node)
        has = str_if_bytes(role[0]) == "master" and len(role[2]) > 0
    except Exception:  # redis-py's cluster errors are not all RedisErrors
        has = True
    known[node.name] = (now + REPLICAS_CHECKED_S, has)
    return has


def _degraded(client: Any) -> dict[str, float]:
    """Per master (its node name; "" for a plain or Sentinel client): until when its writes
    go without WAIT after a shortfall."""
    return getattr(client, _DEGRADED_ATTR, {})


def queue_wait(pipe: Any, client: Any) -> list[str]:
    """Queue ``WAIT`` at the end of ``pipe`` if ``client`` asks for replicas: one for a plain
    or Sentinel client, one per master the pipeline writes to on a cluster (not those skipped
    after a shortfall). The masters waited for ("" for a plain client): pass them to
    :func:`took_wait`; empty (false) when none was queued."""
    wanted, timeout_ms = wait_policy(client)
    if wanted == 0:
        return []
    now, skipped = time.monotonic(), _degraded(client)
    if not isinstance(pipe, ClusterPipeline):
        if wanted < 0 or skipped.get("", 0.0) > now:
            return []
        pipe.wait(wanted, timeout_ms)
        return [""]
    if not isinstance(pipe, WaitingPipeline):  # checkbeat's Cluster makes only these
        raise TypeError("a cluster pipeline that cannot wait: make the client with get_redis")
    by_master: dict[str, int] = {}
    for slot in pipe.written_slots():
        owner = pipe.owner(slot)
        if owner.name not in by_master and (wanted > 0 or _has_replica(client, owner)):
            by_master[owner.name] = slot
    waited = [name for name in by_master if skipped.get(name, 0.0) <= now]
    for name in waited:
        pipe.queue_wait_on_slot(by_master[name], max(wanted, 1), timeout_ms)
    return waited


def took_wait(results: list[Any], queued: list[str], client: Any, what: str) -> list[Any]:
    """``results`` without the WAITs' answers (the last ``len(queued)``); a shortfall is
    logged and counted, once per pipeline, and its master skipped for ``DEGRADED_S``."""
    if not queued:
        return results
    answers, results = results[-len(queued) :], results[: -len(queued)]
    wanted, timeout_ms = wait_policy(client)
    wanted = max(wanted, 1)  # PER_MASTER queued WAIT 1 where it queued one
    short = []
    for master, answer in zip(queued, answers, strict=True):
        if isinstance(answer, Exception):  # a pipeline run with raise_on_error=False
            raise answer
        if int(answer) < wanted:
            short.append((master, int(answer)))
    if short:
        global _shortfalls
        with _lock:
            _shortfalls += 1
        skipped, until = _degraded(client), time.monotonic() + DEGRADED_S
        for master, _acked in short:
            skipped[master] = until
        log.warning(
            "checkbeat: %s acknowledged by %s of %d replicas within %d ms; going on without "
            "WAIT for %.0f s (a failover now could lose writes)",
            what,
            ", ".join(f"{acked} on {master}" if master else str(acked) for master, acked in short),
            wanted,
            timeout_ms,
            DEGRADED_S,
        )
    return results


def shortfalls() -> int:
    """WAITs of this process that timed out short of their replicas (tests, metrics)."""
    return _shortfalls


def run_replicated(
    client: Any, name: str, keys: Sequence[str], args: Sequence[Any], what: str
) -> Any:
    """``run_script(client, name, keys, args)``, then WAIT on the same connection; its answer.

    A cluster pipeline answers NOSCRIPT (a node restarted at the same address lost its script
    cache) without running the call, and loads the scripts again for the next one: the call is
    sent once more."""
    try:
        return _run_and_wait(client, name, keys, args, what)
    except NoScriptError:
        if not isinstance(client, RedisCluster):
            raise
        return _run_and_wait(client, name, keys, args, what)


def _run_and_wait(
    client: Any, name: str, keys: Sequence[str], args: Sequence[Any], what: str
) -> Any:
    pipe = client.pipeline(transaction=False)
    run_script(pipe, name, keys, args)
    queued = queue_wait(pipe, client)
    return took_wait(pipe.execute(), queued, client, what)[0]
