"""The HTTP server of one process: ``/metrics``, ``/healthz`` and any extra pages.

Why our own small server and not ``prometheus_client.start_http_server``: beat also serves the
per-check pages (``/metrics/checks?page=N``) and both need ``/healthz`` with their own rule, on
the one port ``CHECKBEAT_METRICS_ADDR`` names. It runs in daemon threads, so a slow scrape never
delays a tick or a run, and it keeps the process's entry in the endpoint list fresh.

Credentials: with ``CHECKBEAT_METRICS_BASIC_AUTH`` or ``CHECKBEAT_METRICS_BEARER_TOKEN`` set,
every page (``/healthz`` too: a Kubernetes or compose probe can send the header) answers 401
without one of them; either one is accepted. They are compared in constant time and never
logged.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from celery_app.errors import CheckbeatError
from celery_app.metrics import endpoints
from celery_app.redis.schema import Keys
from celery_app.settings import Settings, listen_address

log = logging.getLogger(__name__)

JSON = "application/json"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


@dataclass(frozen=True, repr=False)
class Credentials:
    """What a request must carry: basic auth ``user:password``, a bearer token, or either."""

    basic: str | None = None
    bearer: str | None = None

    def __repr__(self) -> str:  # the values are secrets
        basic, bearer = ("***" if value else None for value in (self.basic, self.bearer))
        return f"Credentials(basic={basic}, bearer={bearer})"

    @classmethod
    def of(cls, settings: Settings) -> Credentials | None:
        """The settings' credentials, or None (the pages are open)."""
        basic, bearer = settings.metrics_basic_auth, settings.metrics_bearer_token
        if basic is None and bearer is None:
            return None
        return cls(
            basic=None if basic is None else basic.get_secret_value(),
            bearer=None if bearer is None else bearer.get_secret_value(),
        )

    def allows(self, authorization: str | None) -> bool:
        scheme, _, value = (authorization or "").strip().partition(" ")
        value = value.strip()
        if self.bearer is not None and scheme.lower() == "bearer":
            return hmac.compare_digest(value.encode(), self.bearer.encode())
        if self.basic is not None and scheme.lower() == "basic":
            try:
                given = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, self.basic.encode())
        return False

    def authorization(self) -> str:
        """What a client of these pages sends (``checkbeat status`` scraping the workers)."""
        if self.bearer is not None:
            return f"Bearer {self.bearer}"
        return "Basic " + base64.b64encode((self.basic or "").encode()).decode("ascii")

    def challenge(self) -> str:
        return 'Basic realm="checkbeat"' if self.basic is not None else 'Bearer realm="checkbeat"'


class PageError(CheckbeatError, ValueError):
    """A bad query parameter; the message names it and the allowed values (HTTP 400)."""


#: A page: the query's parameters (first value of each) -> the reply.
Page = Callable[[Mapping[str, str]], Reply]


class Collected:
    """A collector made of others (the default registry, scrape-time readers)."""

    def __init__(self, *collectors: Any) -> None:
        self.collectors = collectors

    def collect(self) -> Iterable[Any]:
        for collector in self.collectors:
            yield from collector.collect()


def metrics_page(collector: Any) -> Page:
    def page(_query: Mapping[str, str]) -> Reply:
        return Reply(200, generate_latest(collector), CONTENT_TYPE_LATEST)

    return page


def health_page(check: Callable[[], tuple[bool, dict[str, Any]]]) -> Page:
    """200 with the details when ``check`` says healthy, else 503 (what probes act on)."""

    def page(_query: Mapping[str, str]) -> Reply:
        try:
            ok, detail = check()
        except Exception as exc:  # a health check that cannot run is unhealthy
            ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
        body = json.dumps({"ok": ok, **detail}, default=str).encode()
        return Reply(200 if ok else 503, body, JSON)

    return page


def default_collector() -> Any:
    return REGISTRY


class MetricsServer:
    """Serves ``pages`` (path -> page) on ``address`` until :meth:`stop`."""

    def __init__(
        self,
        address: str,
        pages: Mapping[str, Page],
        *,
        name: str,
        role: str,
        client: redis.Redis | None = None,
        keys: Keys | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.credentials = credentials
        self.host, self.port = listen_address(address)
        self.pages = dict(pages)
        self.name = name
        self.role = role
        self.client = client
        self.keys = keys
        self._httpd: ThreadingHTTPServer | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        """Where to scrape it: the bound port, and this host's name for a wildcard address."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        pages = self.pages
        credentials = self.credentials

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                page = pages.get(parts.path.rstrip("/") or "/")
                challenge = None
                if credentials is not None and not credentials.allows(
                    self.headers.get("Authorization")
                ):
                    reply = Reply(401, b"credentials required\n")
                    challenge = credentials.challenge()
                elif page is None:
                    reply = Reply(404, f"not found; try {', '.join(sorted(pages))}\n".encode())
                else:
                    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                    try:
                        reply = page(query)
                    except PageError as exc:
                        reply = Reply(400, f"{exc}\n".encode())
                    except Exception as exc:
                        log.exception("metrics: %s failed", parts.path)
                        reply = Reply(500, f"{type(exc).__name__}: {exc}\n".encode())
                self.send_response(reply.status)
                if challenge is not None:
                    self.send_header("WWW-Authenticate", challenge)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # scrapes every few seconds must not flood the process log

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        self._httpd = Server((self.host, self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(
            target=self._httpd.serve_forever, name="checkbeat-metrics", daemon=True
        ).start()
        if self.client is not None:
            threading.Thread(target=self._refresh, name="checkbeat-endpoint", daemon=True).start()
        guarded = " (credentials required)" if credentials is not None else ""
        log.info(
            "metrics: %s serves %s on %s%s", self.name, ", ".join(sorted(pages)), self.url, guarded
        )
        return self

    def _refresh(self) -> None:
        assert self.client is not None and self.keys is not None
        while True:
            try:
                endpoints.register(self.client, self.keys, self.name, self.url, self.role)
            except redis.RedisError as exc:
                log.warning("metrics: could not register the endpoint of %s: %s", self.name, exc)
            if self._stop.wait(endpoints.REFRESH_S):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self.client is not None and self.keys is not None:
            try:
                endpoints.unregister(self.client, self.keys, self.name)
            except redis.RedisError as exc:
                log.warning("metrics: could not unregister %s: %s", self.name, exc)


def start_or_log(server: MetricsServer) -> MetricsServer | None:
    """Start ``server``; if its address cannot be bound (taken, e.g. by the worker a ``-B``
    beat runs in), log it and go on without metrics: a process must not die for them."""
    try:
        return server.start()
    except OSError as exc:
        log.error(
            "metrics: %s cannot listen on %s:%s (%s); it runs without /metrics and /healthz",
            server.name,
            server.host,
            server.port,
            exc,
        )
        return None
