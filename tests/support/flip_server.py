"""A target on 127.0.0.1 that fails on command, per region: ``GET /<region>`` answers 200 while
the region is healthy and 503 after ``fail(region)`` (until ``heal(region)``). Any path works
the same way (``/<uid>/<region>`` is the name ``<uid>/<region>``), and when each request of a
name arrived is kept (``hit_times``), so a test can count runs per tick; ``set_delay`` makes a
name answer that much later (a probe in flight when a test kills something)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.served import ServedInThread


class FlipServer(ServedInThread):
    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.hits: dict[str, int] = {}
        self.times: dict[str, list[float]] = {}
        self.delays: dict[str, float] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                region = self.path.strip("/")
                with outer._lock:
                    outer.hits[region] = outer.hits.get(region, 0) + 1
                    outer.times.setdefault(region, []).append(time.time())
                    code = 503 if region in outer.failing else 200
                    delay = outer.delays.get(region, 0.0)
                if delay:
                    time.sleep(delay)
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if code == 200 else b"no")

            def log_message(self, format: str, *args: object) -> None:
                return

        self._serve(ThreadingHTTPServer(("127.0.0.1", 0), Handler))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hit_times(self, name: str) -> list[float]:
        """When each request of ``name`` arrived (Unix s, this host's clock), in order."""
        with self._lock:
            return list(self.times.get(name, ()))

    def set_delay(self, name: str, seconds: float) -> None:
        with self._lock:
            self.delays[name] = seconds

    def fail(self, *regions: str) -> None:
        with self._lock:
            self.failing.update(regions)

    def heal(self, *regions: str) -> None:
        with self._lock:
            self.failing.difference_update(regions)
