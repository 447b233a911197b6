"""A Redis Sentinel deployment on loopback from the bundled redis-server: one master, one
replica, three Sentinels (``redis-server <conf> --sentinel``), each on an ephemeral port.

Why generated configs: a Sentinel rewrites its config file as it learns the topology, so each
gets its own file in its own directory. Down-after is short (``DOWN_AFTER_MS``) so a failover
completes within a few seconds in a test.
"""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_app.local.embedded_redis import RedisServer, find_redis_server, free_port
from support.polling import wait_for
from support.projects import stop

MASTER_NAME = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


@dataclass
class SentinelProcess:
    directory: Path
    port: int
    master_port: int
    binary: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.directory}",
                    f"logfile {self.directory / 'sentinel.log'}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )
        self.process = subprocess.Popen(
            [self.binary, str(conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=1, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=10)


def sentinels_agree(sentinels: list) -> bool:
    """Every Sentinel answers, sees the two others and the replica (each has ``.client()``)."""
    for sentinel in sentinels:
        try:
            with sentinel.client() as client:
                state = client.sentinel_master(MASTER_NAME)
        except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError):
            return False
        if int(state.get("num-other-sentinels", 0)) < 2 or int(state.get("num-slaves", 0)) < 1:
            return False
    return True


def master_port_seen(sentinels: list) -> int | None:
    """The master port the first answering Sentinel reports."""
    for sentinel in sentinels:
        with contextlib.suppress(redis.RedisError), sentinel.client() as client:
            _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            return int(port)
    return None


@dataclass
class SentinelDeployment:
    root: Path
    binary: str = field(default_factory=find_redis_server)
    master: RedisServer | None = None
    replica: RedisServer | None = None
    sentinels: list[SentinelProcess] = field(default_factory=list)

    def url(self, db: int) -> str:
        """The kombu-style URL of the three Sentinels, database at the end."""
        parts = [f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels]
        return ";".join(parts) + f"/{db}"

    def start(self, timeout: float = 30.0) -> SentinelDeployment:
        self.master = RedisServer(self.root / "master").start()
        self.replica = RedisServer(self.root / "replica").start()
        replica = redis.Redis(port=self.replica.port, socket_timeout=2)
        replica.replicaof("127.0.0.1", self.master.port)
        replica.close()
        self.sentinels = [
            SentinelProcess(
                self.root / f"sentinel{i}", free_port(), self.master.port, self.binary
            ).start()
            for i in range(3)
        ]
        wait_for(self._ready, timeout, what="the replica to sync and 3 sentinels to see it")
        return self

    def _ready(self) -> bool:
        assert self.master is not None
        info = redis.Redis(port=self.master.port, socket_timeout=1).info("replication")
        if info.get("connected_slaves") != 1:
            return False
        return sentinels_agree(self.sentinels)

    def master_port_seen(self) -> int | None:
        return master_port_seen(self.sentinels)

    def kill_master(self) -> None:
        assert self.master is not None
        self.master.kill()

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in (self.replica, self.master):
            if server is not None:
                server.stop()
