"""Redis Cluster URLs for the state store: ``redis+cluster://[user:password@]host:port[,host:port...]``
(``rediss+cluster://`` for TLS).

Why a scheme of its own: redis-py's ``RedisCluster.from_url`` takes one ``redis://`` address and
discovers the rest, so a plain ``redis://`` URL cannot say "this is a cluster"; the scheme does,
and the comma list gives more than one startup node (any one that answers is enough). A cluster
has only database 0, so a ``/db`` other than 0 is refused rather than silently ignored.

Pure parsing (no redis import): :mod:`celery_app.settings` validates the URL with it, and
:mod:`celery_app.redis.cluster` builds the client from the parsed form.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from celery_app.errors import CheckbeatError

SCHEMES = ("redis+cluster", "rediss+cluster")
FORM = "redis+cluster://[user:password@]host:port[,host:port...] (rediss+cluster:// for TLS)"


class ClusterUrlError(CheckbeatError, ValueError):
    """A cluster URL that does not parse; the message names the part at fault and the form."""


def is_cluster_url(url: str | None) -> bool:
    if not url:
        return False
    return url.split("://", 1)[0].lower() in SCHEMES


@dataclass(frozen=True)
class ClusterUrl:
    nodes: tuple[tuple[str, int], ...]
    tls: bool = False
    username: str | None = None
    password: str | None = None


def parse_cluster_url(url: str) -> ClusterUrl:
    """The startup nodes, TLS and credentials of a cluster URL (see the module docstring)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ClusterUrlError(
            f"must start with redis+cluster:// or rediss+cluster://; form: {FORM}"
        )
    if "?" in rest or "#" in rest:
        raise ClusterUrlError(f"query options are not read here, use settings; form: {FORM}")
    netloc, slash, path = rest.partition("/")
    path = path.strip("/")
    if slash and path not in ("", "0"):
        raise ClusterUrlError(f"a Redis Cluster has only database 0, got /{path}; form: {FORM}")
    creds, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, _, secret = creds.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    nodes = tuple(_node(part.strip()) for part in hosts.split(",") if part.strip())
    if not nodes:
        raise ClusterUrlError(f"no host:port startup node; form: {FORM}")
    return ClusterUrl(nodes, scheme.lower() == "rediss+cluster", username, password)


def _node(part: str) -> tuple[str, int]:
    if part.startswith("["):  # [ipv6]:port
        host, bracket, tail = part[1:].partition("]")
        if not bracket or not host:
            raise ClusterUrlError(f"{part!r}: unclosed IPv6 address; form: {FORM}")
        port_text = tail.removeprefix(":") if tail else "6379"
        if tail and not tail.startswith(":"):
            raise ClusterUrlError(f"{part!r}: expected :port after the address; form: {FORM}")
    else:
        host, colon, port_text = part.partition(":")
        port_text = port_text if colon else "6379"
        if not host:
            raise ClusterUrlError(f"{part!r}: no host; form: {FORM}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ClusterUrlError(
            f"{part!r}: the port must be 1-65535, got {port_text!r}; form: {FORM}"
        )
    return host, int(port_text)
