"""A small threaded HTTP server on 127.0.0.1 that answers after a chosen delay.

Used by the worker tests and the overload bench as a real probe target. Paths:

- ``/delay/<ms>``: 200 ``ok`` after ``ms`` milliseconds;
- ``/named/<name>``: 200 after the delay currently set for ``name`` (``set_delay``), so a test
  can make one check slow and then fast again;
- ``/status/<code>``: that status code;
- ``/body``: 200 with a known body (``BODY``);
- ``/redirect?to=<url>``: 302 to ``url``.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

BODY = b"hello from the checkbeat test target"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def __init__(self, target: DelayServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target = target

    def handle_error(self, request: object, client_address: object) -> None:
        """A probe that gave up (timeout) closes its end: not worth a traceback."""
        return


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _answer(self, code: int, body: bytes = b"ok", location: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        target = self.server.target
        parts = urlsplit(self.path)
        segments = [s for s in parts.path.split("/") if s]
        target.count(parts.path)
        if len(segments) == 2 and segments[0] == "delay":
            time.sleep(int(segments[1]) / 1000.0)
            return self._answer(200)
        if len(segments) == 2 and segments[0] == "named":
            time.sleep(target.delay_of(segments[1]) / 1000.0)
            return self._answer(200)
        if len(segments) == 2 and segments[0] == "status":
            return self._answer(int(segments[1]))
        if segments == ["body"]:
            return self._answer(200, BODY)
        if segments == ["redirect"]:
            to = parse_qs(parts.query).get("to", [""])[0]
            return self._answer(302, b"", location=to)
        return self._answer(404, b"not found")


class DelayServer:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    def __init__(self) -> None:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._delays: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._times: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def set_delay(self, name: str, ms: float) -> None:
        with self._lock:
            self._delays[name] = ms

    def delay_of(self, name: str) -> float:
        with self._lock:
            return self._delays.get(name, 0.0)

    def count(self, path: str) -> None:
        with self._lock:
            self._counts[path] = self._counts.get(path, 0) + 1
            self._times.setdefault(path, []).append(time.time())

    def hits(self, path: str) -> int:
        with self._lock:
            return self._counts.get(path, 0)

    def hit_times(self, path: str) -> list[float]:
        """When each request of ``path`` arrived (Unix s, this host's clock), in order."""
        with self._lock:
            return list(self._times.get(path, ()))

    def start(self) -> DelayServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> DelayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
