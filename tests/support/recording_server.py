"""A real HTTP/1.1 server on 127.0.0.1 (https with a certificate the test chose) that answers
each path from a route or a page the test set, and records every request it received (method,
path, headers): what a probe sent, where.

Why one server for every probe test: the redirect and secret tests assert what each origin saw
(two instances on two ports are two origins); the judgement tests need bodies and certificates
they control: TLS is a server certificate issued by a throwaway ``trustme`` CA with the validity
the test asks for, so the probe's own TLS connection reads its expiry.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trustme

from support.served import ServedInThread

#: A route: (the request's headers, names in lower case; how many requests of this path came
#: before, since the server started) -> status, response headers, body.
Route = Callable[[dict[str, str], int], tuple[int, dict[str, str], bytes]]
#: One request as it came: method, path (with its query), headers (names in lower case, each
#: with every value it was sent with).
Seen = tuple[str, str, dict[str, list[str]]]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        return  # a probe that hangs up mid-body (its cap, its deadline) is no server error


class RecordingServer(ServedInThread):
    """Serve ``routes`` (path without its query -> :data:`Route`) and :meth:`page`; https when
    ``not_after`` is given (the certificate's end of validity; ``ca_file``, written in
    ``ca_dir``, is the PEM of the CA that issued it)."""

    def __init__(self, ca_dir: Path | None = None, *, not_after: datetime | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[Seen] = []
        self._count: dict[str, int] = {}  # requests per path, without its query
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body are two writes: with Nagle's algorithm on a kept-alive
            # connection the body would wait for the client's delayed ACK of the headers.
            disable_nagle_algorithm = True

            def _any(self) -> None:
                sent: dict[str, list[str]] = {}
                for name, value in self.headers.items():
                    sent.setdefault(name.lower(), []).append(value)
                path = self.path.split("?")[0]
                with outer._lock:
                    before = outer._count.get(path, 0)
                    outer._count[path] = before + 1
                    outer.seen.append((self.command, self.path, sent))
                route = outer.routes.get(path)
                last = {name: values[-1] for name, values in sent.items()}
                status, extra, body = route(last, before) if route else (404, {}, b"no route")
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_HEAD = _any

            def log_message(self, format: str, *args: object) -> None:
                return

        self._serve(_Server(("127.0.0.1", 0), Handler), poll_interval=0.05)
        self.port = self._server.server_address[1]
        self.ca_file: str | None = None
        self.scheme = "http"
        if not_after is not None:
            if ca_dir is None:
                raise ValueError("an https server needs ca_dir, where its CA's PEM is written")
            ca = trustme.CA()
            leaf = ca.issue_cert("127.0.0.1", not_after=not_after)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            leaf.configure_cert(context)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            ca_path = ca_dir / "ca.pem"
            ca.cert_pem.write_to_path(str(ca_path))
            self.ca_file = str(ca_path)
            self.scheme = "https"

    def answer(self, path: str, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        """Answer every request for ``path`` the same: a route that reads nothing of it."""
        self.routes[path] = lambda _headers, _before: (status, headers, body)

    def page(self, path: str, body: bytes | str, *, status: int = 200, ctype: str = "") -> str:
        """Serve ``body`` at ``path`` (``ctype`` its Content-Type, text by default); the URL of
        that page."""
        data = body.encode() if isinstance(body, str) else body
        self.answer(path, status, {"Content-Type": ctype or "text/plain; charset=utf-8"}, data)
        return self.url(path)

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def headers_of(self, path: str) -> dict[str, str]:
        """The headers of the first request for ``path`` (each sent once: asserted)."""
        sent = next(h for _, p, h in self.requests() if p == path)
        assert all(len(values) == 1 for values in sent.values()), sent
        return {name: values[0] for name, values in sent.items()}
