"""A real HTTP(S) server on 127.0.0.1 that answers each path with a body the test chose.

Why: the http judgement tests (regex, JSON path, certificate expiry) need bodies and
certificates they control; TLS is a server certificate issued by a throwaway ``trustme`` CA
with the validity the test asks for, so the probe's own TLS connection reads its expiry.
"""

from __future__ import annotations

import ssl
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trustme


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def do_GET(self) -> None:
        status, content_type, body = self.server.pages.get(
            self.path, (404, "text/plain", b"not found")
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    pages: dict[str, tuple[int, str, bytes]]

    def handle_error(self, request: object, client_address: object) -> None:
        return


class ContentServer:
    """Serve ``pages`` (path -> (status, content type, body)); https when ``not_after`` is given
    (the certificate's end of validity; ``ca_file`` is the PEM of the CA that issued it)."""

    def __init__(self, tmp: Path, *, not_after: datetime | None = None) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.pages = {}
        self.ca_file: str | None = None
        self.scheme = "http"
        if not_after is not None:
            ca = trustme.CA()
            leaf = ca.issue_cert("127.0.0.1", not_after=not_after)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            leaf.configure_cert(context)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            ca_path = tmp / "ca.pem"
            ca.cert_pem.write_to_path(str(ca_path))
            self.ca_file = str(ca_path)
            self.scheme = "https"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def page(self, path: str, body: bytes | str, *, status: int = 200, ctype: str = "") -> str:
        """Serve ``body`` at ``path``; the URL of that page."""
        data = body.encode() if isinstance(body, str) else body
        self._server.pages[path] = (status, ctype or "text/plain; charset=utf-8", data)
        return self.url(path)

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_address[1]}{path}"

    def __enter__(self) -> ContentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
