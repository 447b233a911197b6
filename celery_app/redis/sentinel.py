"""Redis Sentinel URLs, in the form kombu's broker transport reads:
``sentinel://[user:password@]host:port;sentinel://host:port[/db]``.

Why one parser for state and broker: both must find the same master by the same Sentinels, so
``CHECKBEAT_REDIS_URL`` and ``CHECKBEAT_BROKER_URL`` are spelled alike and read alike. kombu
takes the database (and the data nodes' password) from the *first* address only; the issue's
form puts ``/db`` after the last, so :func:`kombu_url` repeats the database and credentials on
every address, and kombu, redis-py and the user all read the same thing.

The master name is ``CHECKBEAT_REDIS_SENTINEL_MASTER``; the Sentinels' own password is
``CHECKBEAT_REDIS_SENTINEL_PASSWORD``; ``CHECKBEAT_REDIS_SENTINEL_TLS`` turns on TLS to the
Sentinels and to the data nodes, verified per ``CHECKBEAT_REDIS_TLS_*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_app.errors import CheckbeatError
from celery_app.settings import Settings

SCHEME = "sentinel"


class SentinelUrlError(CheckbeatError, ValueError):
    """A sentinel:// URL that does not parse; the message names the part at fault."""


def is_sentinel_url(url: str | None) -> bool:
    if not url:
        return False
    return url.split("://", 1)[0].lower() == SCHEME


@dataclass(frozen=True)
class SentinelUrl:
    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None

    def node_kwargs(self) -> dict[str, Any]:
        """Credentials and database of the data nodes (master and replicas)."""
        found: dict[str, Any] = {"db": self.db}
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        return found


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Every ``sentinel://host:port`` of ``url`` (``;``-separated), its database and the data
    nodes' credentials (on any one address; two that differ are refused)."""
    hosts: list[tuple[str, int]] = []
    dbs: set[int] = set()
    creds: set[tuple[str | None, str | None]] = set()
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        split = urlsplit(part)
        if split.scheme.lower() != SCHEME:
            raise SentinelUrlError(f"{part!r}: every address must start with sentinel://")
        try:
            port = split.port or 26379
        except ValueError as exc:
            raise SentinelUrlError(f"{part!r}: bad port ({exc})") from None
        if not split.hostname:
            raise SentinelUrlError(f"{part!r}: no host")
        hosts.append((split.hostname, port))
        path = split.path.strip("/")
        if path:
            if not path.isdigit():
                raise SentinelUrlError(f"{part!r}: the database must be a number, got {path!r}")
            dbs.add(int(path))
        if split.username or split.password:
            user, password = unquote(split.username or ""), unquote(split.password or "")
            creds.add((user or None, password or None))
    if not hosts:
        raise SentinelUrlError(f"{url!r}: no sentinel://host:port address")
    if len(dbs) > 1:
        raise SentinelUrlError(f"{url!r}: the addresses name different databases {sorted(dbs)}")
    if len(creds) > 1:
        raise SentinelUrlError(f"{url!r}: the addresses carry different credentials")
    username, secret = creds.pop() if creds else (None, None)
    return SentinelUrl(tuple(hosts), dbs.pop() if dbs else 0, username, secret)


def kombu_url(url: str) -> str:
    """``url`` with the database and credentials on every address (kombu reads the first)."""
    parsed = parse_sentinel_url(url)
    auth = ""
    if parsed.username or parsed.password:
        auth = f"{parsed.username or ''}:{parsed.password or ''}@"
    return ";".join(f"{SCHEME}://{auth}{h}:{p}/{parsed.db}" for h, p in parsed.hosts)


def sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    """Options of the connections to the Sentinels themselves.

    No retry on a Sentinel's connection: a Sentinel that is down or refuses the handshake is
    skipped for the next one at once (redis-py's default retries each with a backoff, several
    seconds per Sentinel per master lookup; a wrong CA took 113 s to be reported).
    """
    found: dict[str, Any] = {
        "socket_timeout": 1.0,
        "socket_connect_timeout": 1.0,
        "retry": Retry(NoBackoff(), 0),
    }
    if settings.redis_sentinel_password:
        found["password"] = settings.redis_sentinel_password
    found.update(sentinel_tls_kwargs(settings))
    return found


def sentinel_tls_kwargs(settings: Settings) -> dict[str, Any]:
    """redis-py TLS options for Sentinel deployments ({} unless CHECKBEAT_REDIS_SENTINEL_TLS)."""
    if not settings.redis_sentinel_tls:
        return {}
    options: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": settings.redis_tls_cert_reqs}
    if settings.redis_tls_ca_file:
        options["ssl_ca_certs"] = settings.redis_tls_ca_file
    if settings.redis_tls_certfile:
        options["ssl_certfile"] = settings.redis_tls_certfile
    if settings.redis_tls_keyfile:
        options["ssl_keyfile"] = settings.redis_tls_keyfile
    return options


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's Sentinel transport options for this broker ({} for a plain Redis broker)."""
    if not is_sentinel_url(settings.effective_broker_url):
        return {}
    return {
        "master_name": settings.redis_sentinel_master,
        "sentinel_kwargs": sentinel_kwargs(settings),
    }
