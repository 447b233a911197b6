"""Real receivers of notifications on 127.0.0.1: an HTTP server that records every POST (path,
headers, exact body) and answers 500 while told to fail, and an SMTP server (``aiosmtpd``)
that keeps every message it accepts. Their fixtures are in ``notify_fixtures``."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis

from celery_app.checks.notify import NotifyStore, validate_target
from celery_app.redis.schema import Keys
from support.served import ServedInThread


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes


class HttpReceiver(ServedInThread):
    """Records each request; answers 500 to a path while it is in :attr:`failing` or before its
    :attr:`failing_until` (``time.monotonic()``), else 200 (a refused request is counted in
    :attr:`refused`, not recorded)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.refused: dict[str, int] = {}
        self.failing: set[str] = set()
        self.failing_until: dict[str, float] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                path = self.path.split("?")[0]
                with outer._lock:
                    down = time.monotonic() < outer.failing_until.get(path, 0.0)
                    if path in outer.failing or down:
                        outer.refused[path] = outer.refused.get(path, 0) + 1
                        status, answer = 500, b"receiver down"
                    else:
                        outer.received.append(Received(self.path, headers, body))
                        status, answer = 200, b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._serve(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        self.port = self._server.server_address[1]

    def got(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path.split("?")[0] == path]

    def notify_tenant(self, r: redis.Redis, keys: Keys, tenant: str, path: str) -> None:
        """Store a notification target of ``tenant``: Apprise's ``json://`` to ``path`` here."""
        url = f"json://127.0.0.1:{self.port}{path}"
        NotifyStore(r, keys).add(validate_target(tenant=tenant, url=url))


class SmtpReceiver:
    """An SMTP server (aiosmtpd) on 127.0.0.1 keeping every message it accepts."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        # aiosmtpd logs every connection at INFO; under an in-process worker (whose logging
        # setup takes the root logger) that would reach the test run's output
        logging.getLogger("mail.log").setLevel(logging.WARNING)
        self.messages: list[Message] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server, session, envelope) -> str:
                outer.messages.append(message_from_bytes(envelope.original_content))
                return "250 OK"

        with socket.socket() as probe:  # a free port (the controller takes a port number)
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()
