"""A three-master Redis Cluster on loopback from the bundled redis-server
(``--cluster-enabled yes``), slots assigned and nodes met by the test itself.

Why by hand: the bundled binary is Redis 6.2 (no ``redis-cli --cluster create`` here, no
``CLUSTER ADDSLOTSRANGE``, no ``--cluster-port``), so each node takes ``ADDSLOTS`` of its third
of the 16384 slots, then ``CLUSTER MEET``s the others; the cluster bus listens on port + 10000,
so a node's port is picked with that one free too.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_app.local.embedded_redis import RedisServer, find_redis_server
from support.polling import wait_for
from support.projects import stop

SLOTS = 16384
BUS_OFFSET = 10000


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + BUS_OFFSET < 65536 and _free(port + BUS_OFFSET):
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

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=10)


@dataclass
class LocalCluster:
    """The cluster for checkbeat's state, and a separate plain redis-server for the broker
    (kombu has no Cluster transport)."""

    root: Path
    masters: int = 3
    binary: str = field(default_factory=find_redis_server)
    nodes: list[ClusterNodeProcess] = field(default_factory=list)
    broker: RedisServer | None = None

    def url(self) -> str:
        """The ``redis+cluster://`` URL checkbeat reads, every node a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def broker_url(self) -> str:
        assert self.broker is not None
        return self.broker.url(0)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        self.broker = RedisServer(self.root / "broker").start()
        for i in range(self.masters):
            self.nodes.append(
                ClusterNodeProcess(self.root / f"node{i}", free_cluster_port(), self.binary).start()
            )
        wait_for(lambda: all(n.answers() for n in self.nodes), timeout, what="the nodes to start")
        share = SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            first = i * share
            last = SLOTS - 1 if i == self.masters - 1 else first + share - 1
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        with self.nodes[0].client() as client:
            for other in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", other.port)
        wait_for(self._ok, timeout, what="cluster_state:ok on every node")
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            try:
                with node.client() as client:
                    info = client.cluster("INFO")  # redis-py parses it into a dict
            except redis.RedisError:
                return False
            if info.get("cluster_state") != "ok":
                return False
            if int(info.get("cluster_known_nodes", 0)) != self.masters:
                return False
        return True

    def node_of_slot(self, slot: int) -> ClusterNodeProcess:
        share = SLOTS // self.masters
        return self.nodes[min(slot // share, self.masters - 1)]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.broker is not None:
            self.broker.stop()
