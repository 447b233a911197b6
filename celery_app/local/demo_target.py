"""A local HTTP server with endpoints that behave like real targets do on a bad day.

``checkbeat up --demo`` points its demo checks here so lanes form without touching the internet:
``/fast`` answers in ~20 ms, ``/slow`` in ~3 s (it drifts to the slow lane), ``/flaky`` fails one
request in three, ``/flapping`` fails for FLAP_DOWN_S seconds of every FLAP_PERIOD_S (its check
goes down and recovers through the thresholds), ``/timeout`` outlasts any execution ceiling.
``?ms=N`` overrides the delay.
"""

from __future__ import annotations

import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DELAYS_MS = {"/fast": 20, "/slow": 3000, "/flaky": 50, "/flapping": 30, "/timeout": 60_000, "/": 0}
#: ``/flapping`` answers 503 during the first FLAP_DOWN_S seconds of every FLAP_PERIOD_S.
FLAP_PERIOD_S = 40
FLAP_DOWN_S = 20


def flapping_down(now: float) -> bool:
    return now % FLAP_PERIOD_S < FLAP_DOWN_S


class _Handler(BaseHTTPRequestHandler):
    server_version = "checkbeat-demo/1"

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path not in DELAYS_MS:
            self._reply(404, b"unknown demo endpoint\n")
            return
        query = parse_qs(url.query)
        delay_ms = float(query.get("ms", [DELAYS_MS[url.path]])[0])
        time.sleep(delay_ms / 1000)
        if url.path == "/flaky" and random.random() < 1 / 3:
            self._reply(503, b"flaky: try again\n")
            return
        if url.path == "/flapping" and flapping_down(time.time()):
            self._reply(503, b"flapping: down for now\n")
            return
        self._reply(200, f"ok {url.path}\n".encode())

    do_HEAD = do_GET

    def _reply(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the probe timed out and hung up: that is the point of /timeout

    def log_message(self, format: str, *args: object) -> None:
        pass


class DemoTarget:
    """The demo server on 127.0.0.1, served from a daemon thread."""

    def __init__(self, port: int = 0) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DemoTarget:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
