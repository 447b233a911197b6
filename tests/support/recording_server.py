"""A real HTTP/1.1 server on 127.0.0.1 that answers each path from a route the test chose and
records every request it received (method, path, headers): what a probe sent, where.

Why a recorder: the redirect and secret tests assert what each origin saw; two instances on two
ports are two origins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: A route: (the request's headers, how many requests of this path came before) -> status,
#: response headers, body.
Route = Callable[[dict[str, str], int], tuple[int, dict[str, str], bytes]]


class RecordingServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        #: method, path (with its query), headers (names in lower case)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                headers = {name.lower(): value for name, value in self.headers.items()}
                path = self.path.split("?")[0]
                with outer._lock:
                    before = sum(1 for _, p, _ in outer.seen if p.split("?")[0] == path)
                    outer.seen.append((self.command, self.path, headers))
                route = outer.routes.get(path)
                status, extra, body = route(headers, before) if route else (404, {}, b"no route")
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="recording-server", daemon=True
        )

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        with self._lock:
            return list(self.seen)

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
