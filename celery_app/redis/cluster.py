"""The state store on a Redis Cluster: ``CHECKBEAT_REDIS_URL=redis+cluster://h:p[,h:p...]``.

Why it works with the scripts unchanged: under ``Keys(prefix, cluster=True)`` every key carries
the hash tag of its half (``{checks}`` or ``{cron}``), so every script call, transaction and
multi-key command touches one slot and redis-py routes it by its first key. Commands without a
key (``TIME``, ``INFO``, ``PING``) go to the client's default node, which is set to the node
that owns the check half: the Redis clock the dispatcher, the claim script and the workers read
is then one node's, as on a single Redis. Only the state store: the broker stays a plain or
Sentinel Redis (kombu has no Cluster transport, celery/celery#2852).

Why WAIT is routed by hand: ``WAIT`` counts the replicas that have every earlier write *of the
connection it is sent on*, and redis-py sends a keyless command to the default node. A WAIT that
protects a pipeline's writes (:mod:`celery_app.redis.replication`) is queued with
:meth:`WaitingPipeline.queue_wait_on_slot`: it goes to the node that owns the written slot, in the
same batch and on the same connection as the writes, after them. When any command of the
pipeline had to be sent again on its own (a MOVED, an ASK, a connection lost in a failover:
redis-py retries those one by one on other connections), the WAITs cover nothing it can name,
and answer 0 (a shortfall).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import ClusterNode, ClusterPipeline, PipelineStrategy, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException

from celery_app.cluster_url import parse_cluster_url
from celery_app.redis.schema import Keys
from celery_app.redis.scripts import forget_loaded
from celery_app.settings import Settings


class WaitingPipeline(ClusterPipeline):
    """A cluster pipeline that queues EVALSHA and TIME, which redis-py blocks in cluster
    pipelines: an EVALSHA is routed by its keys (which share one slot here), and TIME goes to
    the default node (the check half's, :func:`time_from_check_half`), as the same calls on one
    Redis would; and WAITs bound to the slot whose writes they cover."""

    #: position in the queue of each command bound to a slot's owner -> that slot
    _bound: dict[int, int]
    #: a command of the last execute() was sent again alone (its WAITs then answer 0)
    _sent_alone: bool

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def time(self, **kwargs: Any) -> Any:
        """TIME on the default node; after a WAIT, on the WAIT's node and connection, so that
        its answer is later than the WAIT's (on a partition's node, whose clock the partition's
        scripts read too)."""
        waits = [slot for position, slot in self._bound.items() if self._is_wait(position)]
        if waits:
            return self._queue_on_slot(waits[-1], "TIME", **kwargs)
        return self.execute_command("TIME", **kwargs)

    def written_slots(self) -> list[int]:
        """The slots the queued keyed commands touch, in the order first met (keyless
        commands and WAITs are not writes of a slot)."""
        slots: dict[int, None] = {}
        for command in self._execution_strategy.command_queue:
            if "target_nodes" in command.options:
                continue
            keys = self._get_command_keys(*command.args)
            if keys:  # a command's keys share one slot, or the pipeline refuses it
                slots.setdefault(self.keyslot(keys[0]), None)
        return list(slots)

    def queue_wait_on_slot(self, slot: int, replicas: int, timeout_ms: int) -> None:
        """Queue ``WAIT replicas timeout_ms`` for the node that owns ``slot`` when the pipeline
        is sent (after a failover, the slot's new owner)."""
        self._queue_on_slot(slot, "WAIT", replicas, timeout_ms)

    def owner(self, slot: int) -> ClusterNode:
        return self.nodes_manager.get_node_from_slot(slot)

    def _queue_on_slot(self, slot: int, *args: Any, **options: Any) -> Any:
        self._bound[len(self._execution_strategy.command_queue)] = slot
        return self.execute_command(*args, target_nodes=self.owner(slot), **options)

    def _is_wait(self, position: int) -> bool:
        return self._execution_strategy.command_queue[position].args[0] == "WAIT"

    def _send_alone(self, *args: Any, **options: Any) -> Any:
        """redis-py's one-by-one retry of a command the batch could not run (MOVED, ASK, a
        lost connection). A WAIT is not sent: on another connection it would count nothing."""
        self._sent_alone = True
        if str(args[0]).upper() == "WAIT":
            return 0
        return RedisCluster.execute_command(self, *args, **options)

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
        other commands of the batch may have run, so it is not replayed here). When a command
        was sent again alone, each WAIT answers 0, whatever it answered on its own connection
        (a node demoted in a failover refuses WAIT: that is a shortfall, not an error)."""
        waits = [position for position in self._bound if self._is_wait(position)]
        self._sent_alone = False
        try:
            results = super().execute(raise_on_error=raise_on_error and not waits)
        except NoScriptError:
            forget_loaded()
            raise
        finally:
            self._bound = {}
        if any(isinstance(result, NoScriptError) for result in results):
            forget_loaded()
        if self._sent_alone:
            for position in waits:
                results[position] = 0
        if raise_on_error and waits:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results


class _Strategy(PipelineStrategy):
    """redis-py's pipeline strategy, with each command bound to a slot (a WAIT, the TIME after
    it) sent to the slot's owner on every attempt (redis-py reads a command's ``target_nodes``
    once: a whole batch sent again after a node was unreachable would route them as keyless
    commands, to the default node)."""

    def _send_cluster_commands(
        self, stack: Any, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> Any:
        pipe: WaitingPipeline = self._pipe  # type: ignore[assignment]  # Cluster.pipeline's
        for command in stack:
            slot = pipe._bound.get(command.position)
            if slot is not None:
                command.options["target_nodes"] = pipe.owner(slot)
        return super()._send_cluster_commands(
            stack, raise_on_error=raise_on_error, allow_redirections=allow_redirections
        )


class Cluster(RedisCluster):
    """redis-py's cluster client whose pipelines are :class:`WaitingPipeline`."""

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        pipe.__class__ = WaitingPipeline  # adds methods and the two fields below to the parent's
        pipe._bound, pipe._sent_alone = {}, False
        pipe.parent_execute_command = pipe._send_alone
        if type(pipe._execution_strategy) is PipelineStrategy:  # not a transaction
            pipe._execution_strategy.__class__ = _Strategy
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
    return mark_client(client, settings, sentinel=False, cluster=True)


def time_from_check_half(client: RedisCluster, keys: Keys) -> None:
    """Make the node that owns the check half the client's default node (keyless commands,
    ``TIME`` above all, go there)."""
    client.set_default_node(client.get_node_from_key(keys.due()))
