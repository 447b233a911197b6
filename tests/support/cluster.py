"""A three-master Redis Cluster on loopback from the bundled redis-server
(``--cluster-enabled yes``), slots assigned and nodes met by the test itself.

Why by hand: the bundled binary is Redis 6.2 (no ``redis-cli --cluster create`` here, no
``CLUSTER ADDSLOTSRANGE``, no ``--cluster-port``), so each node takes ``ADDSLOTS`` of its third
of the 16384 slots, then ``CLUSTER MEET``s the others; the cluster bus listens on port + 10000,
so a node's port is picked with that one free too. With ``replicas=1`` each master gets a
replica (``CLUSTER REPLICATE``), so a test can kill a master and promote its replica
(``CLUSTER FAILOVER TAKEOVER``: at once, without the node timeout's vote).
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_app.local.embedded_redis import RedisServer, find_redis_server

from .polling import wait_for
from .projects import stop

SLOTS = 16384
BUS_OFFSET = 10000


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: set[int]) -> int:
    """A port free on 127.0.0.1 whose cluster bus port (+10000) is free too, neither of them in
    ``taken`` (the ports and bus ports of the nodes started before, which may not listen yet:
    one node's bus port handed to the next node as its port kills one of them); both are added
    to ``taken``."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        bus = port + BUS_OFFSET
        if bus < 65536 and not {port, bus} & taken and _free(bus):
            taken.update((port, bus))
            return port
    raise RuntimeError("no free port pair (port, port + 10000) on 127.0.0.1")


@dataclass
class ClusterNodeProcess:
    directory: Path
    port: int
    binary: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ClusterNodeProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", str(self.directory.resolve()),
                "--logfile", str((self.directory / "redis.log").resolve()),
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--cluster-enabled", "yes",
                "--cluster-config-file", str((self.directory / "nodes.conf").resolve()),
                "--cluster-node-timeout", "5000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def node_id(self) -> str:
        with self.client() as client:
            return str(client.execute_command("CLUSTER MYID"))

    def kill(self) -> None:
        """SIGKILL: what it had not replicated is lost, as when a host dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=10)


@dataclass
class LocalCluster:
    """The cluster for checkbeat's state, and a separate plain redis-server for the broker
    (kombu has no Cluster transport). ``nodes`` are the masters as started, ``replicas[i]``
    the replicas of ``nodes[i]``."""

    root: Path
    masters: int = 3
    replicas_per_master: int = 0
    binary: str = field(default_factory=find_redis_server)
    nodes: list[ClusterNodeProcess] = field(default_factory=list)
    replicas: list[list[ClusterNodeProcess]] = field(default_factory=list)
    broker: RedisServer | None = None

    def url(self) -> str:
        """The ``redis+cluster://`` URL checkbeat reads, every node a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def broker_url(self) -> str:
        assert self.broker is not None
        return self.broker.url(0)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        self.broker = RedisServer(self.root / "broker").start()
        taken = {self.broker.port, self.broker.port + BUS_OFFSET}
        for i in range(self.masters):
            self.nodes.append(
                ClusterNodeProcess(self.root / f"node{i}", free_cluster_port(taken), self.binary)
            )
        for i in range(self.masters):
            self.replicas.append(
                [
                    ClusterNodeProcess(
                        self.root / f"node{i}r{j}", free_cluster_port(taken), self.binary
                    )
                    for j in range(self.replicas_per_master)
                ]
            )
        every = [*self.nodes, *(r for rs in self.replicas for r in rs)]
        for node in every:
            node.start()

        def started() -> bool:
            # a port another process took between the pick and the bind: that node exits at
            # once ("Address already in use"); it starts again on a port of its own
            for node in every:
                if node.exited():
                    node.port = free_cluster_port(taken)
                    node.start()
            return all(n.answers() for n in every)

        wait_for(started, timeout, what="the nodes to start")
        # Distinct config epochs before the nodes meet, as redis-cli --cluster create sets them:
        # left equal, they are settled by collisions over gossip, and a TAKEOVER made before
        # that (the failover tests) can claim slots with an epoch no higher than their dead
        # owner's, which the other nodes then ignore: they keep the dead owner, and answer
        # CLUSTERDOWN for as long as the test runs.
        for epoch, node in enumerate(every, start=1):
            with node.client() as client:
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        share = SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            first = i * share
            last = SLOTS - 1 if i == self.masters - 1 else first + share - 1
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        with self.nodes[0].client() as client:
            for other in every[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", other.port)
        if self.replicas_per_master:
            wait_for(
                lambda: all(self._knows_all(n, len(every)) for n in every),
                timeout,
                what="every node to know every other",
            )
            for master, replicas in zip(self.nodes, self.replicas, strict=True):
                master_id = master.node_id()
                for replica in replicas:
                    with replica.client() as client:
                        client.execute_command("CLUSTER REPLICATE", master_id)
            wait_for(self._replicas_synced, timeout, what="every replica in sync")
        wait_for(self._ok, timeout, what="cluster_state:ok on every node")
        return self

    @staticmethod
    def _knows_all(node: ClusterNodeProcess, count: int) -> bool:
        with node.client() as client:
            return int(client.cluster("INFO").get("cluster_known_nodes", 0)) == count

    def _replicas_synced(self) -> bool:
        for replicas in self.replicas:
            for replica in replicas:
                with replica.client() as client:
                    info = client.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
        return True

    def live_nodes(self) -> list[ClusterNodeProcess]:
        every = [*self.nodes, *(r for rs in self.replicas for r in rs)]
        return [n for n in every if n.process is not None and n.process.poll() is None]

    def current_masters(self) -> list[ClusterNodeProcess]:
        """The live nodes that are masters now (a promoted replica included)."""
        found = []
        for node in self.live_nodes():
            with node.client() as client:
                if client.info("replication").get("role") == "master":
                    found.append(node)
        return found

    def promote(self, replica: ClusterNodeProcess, timeout: float = 30.0) -> float:
        """``CLUSTER FAILOVER TAKEOVER`` on ``replica`` (its master dead), waited for until
        every live node sees the cluster ok again; returns how long that took (s)."""
        began = time.monotonic()
        with replica.client() as client:
            client.execute_command("CLUSTER FAILOVER", "TAKEOVER")
        wait_for(
            lambda: (
                replica in self.current_masters()
                and self._live_ok()
                and self._all_see_serving(replica)
            ),
            timeout,
            what="the replica promoted, seen serving slots by every node, and the cluster ok",
        )
        return time.monotonic() - began

    def _all_see_serving(self, master: ClusterNodeProcess) -> bool:
        """Whether every live node's slot table names ``master`` as the owner of some slots."""
        for node in self.live_nodes():
            try:
                with node.client() as client:
                    ranges = client.execute_command("CLUSTER SLOTS")
            except redis.RedisError:
                return False
            if not any(int(r[2][1]) == master.port for r in ranges):
                return False
        return True

    def _live_ok(self) -> bool:
        for node in self.live_nodes():
            try:
                with node.client() as client:
                    if client.cluster("INFO").get("cluster_state") != "ok":
                        return False
            except redis.RedisError:
                return False
        return True

    def _ok(self) -> bool:
        for node in self.nodes:
            try:
                with node.client() as client:
                    info = client.cluster("INFO")  # redis-py parses it into a dict
            except redis.RedisError:
                return False
            if info.get("cluster_state") != "ok":
                return False
            if int(info.get("cluster_known_nodes", 0)) != self.masters * (
                1 + self.replicas_per_master
            ):
                return False
        return True

    def node_of_slot(self, slot: int) -> ClusterNodeProcess:
        share = SLOTS // self.masters
        return self.nodes[min(slot // share, self.masters - 1)]

    def stop(self) -> None:
        for node in [*self.nodes, *(r for rs in self.replicas for r in rs)]:
            node.stop()
        if self.broker is not None:
            self.broker.stop()
