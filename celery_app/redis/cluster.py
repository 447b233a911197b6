"""The state store on a Redis Cluster: ``CHECKBEAT_REDIS_URL=redis+cluster://h:p[,h:p...]``.

Why it works with the scripts unchanged: under ``Keys(prefix, cluster=True)`` every key carries
the hash tag of its half (``{checks}`` or ``{cron}``), so every script call, transaction and
multi-key command touches one slot and redis-py routes it by its first key. Commands without a
key (``TIME``, ``INFO``, ``PING``) go to the client's default node, which is set to the node
that owns the check half: the Redis clock the dispatcher, the claim script and the workers read
is then one node's, as on a single Redis. Only the state store: the broker stays a plain or
Sentinel Redis (kombu has no Cluster transport, celery/celery#2852).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException

from celery_app.cluster_url import parse_cluster_url
from celery_app.redis.schema import Keys
from celery_app.redis.scripts import forget_loaded
from celery_app.settings import Settings


class _Pipeline(ClusterPipeline):
    """A cluster pipeline that queues EVALSHA and TIME, which redis-py blocks in cluster
    pipelines: an EVALSHA is routed by its keys (which share one slot here), and TIME goes to
    the default node (the check half's, :func:`time_from_check_half`), as the same calls on one
    Redis would."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def time(self, **kwargs: Any) -> Any:
        return self.execute_command("TIME", **kwargs)

    def _get_command_keys(self, *args: Any) -> Any:
        """The keys of a queued command. A script's keys are read from its own arguments:
        redis-py's pipeline otherwise asks the default node (``COMMAND GETKEYS``, one round
        trip each) for every pipelined ``EVALSHA``, since a script's keys are movable, which
        costs each pipelined script a round trip and loads one master with every run's."""
        if str(args[0]).upper() in ("EVALSHA", "EVAL") and len(args) > 2:
            return list(args[3 : 3 + int(args[2])]) or None
        return super()._get_command_keys(*args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """As the parent's; a NOSCRIPT makes the next pipelined script call reload the script
        on every primary (the failed call is the caller's to retry, as after any error: the
        other commands of the batch may have run, so it is not replayed here)."""
        try:
            results = super().execute(raise_on_error=raise_on_error)
        except NoScriptError:
            forget_loaded()
            raise
        if any(isinstance(result, NoScriptError) for result in results):
            forget_loaded()
        return results


class Cluster(RedisCluster):
    """redis-py's cluster client whose pipelines are :class:`_Pipeline`."""

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        pipe.__class__ = _Pipeline  # only adds two methods; the state is the parent's
        return pipe


def cluster_client(url: str, settings: Settings, **options: Any) -> RedisCluster:
    """A client of the cluster the startup nodes of ``url`` belong to (any one answering is
    enough; the rest are discovered, and MOVED/ASK after a reshard or failover are followed)."""
    from celery_app.redis.replication import mark_client
    from celery_app.redis.tls import tls_options

    parsed = parse_cluster_url(url)
    try:  # RedisCluster connects here, a plain client at its first command
        client = Cluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parsed.nodes],
            username=parsed.username,
            password=parsed.password,
            socket_keepalive=True,
            health_check_interval=30,
            **(tls_options(settings) if parsed.tls else {}),
            **options,
        )
    except RedisClusterException as exc:  # as a plain Redis that is down: a ConnectionError
        raise redis.ConnectionError(str(exc)) from exc
    time_from_check_half(client, Keys(settings.key_prefix, cluster=True))
    return mark_client(client, settings, sentinel=False)


def time_from_check_half(client: RedisCluster, keys: Keys) -> None:
    """Make the node that owns the check half the client's default node (keyless commands,
    ``TIME`` above all, go there)."""
    client.set_default_node(client.get_node_from_key(keys.due()))
