"""The HTTP endpoint heartbeat pings come to: ``celery -A proj checks serve-pings``.

One URL per check, its secret token in the path, so a shell can ping with ``curl`` alone::

    GET|POST /ping/<uid>/<token>                 the run succeeded
    GET|POST /ping/<uid>/<token>/start           the run started
    GET|POST /ping/<uid>/<token>/fail            the run failed
    GET|POST /ping/<uid>/<token>/<exit status>   0 succeeded, anything else failed

A POST body (at most ``MAX_PING_BODY`` bytes of UTF-8: a log tail) is kept with the result;
``?duration=<seconds>`` gives the run's duration. Answers: 200 ``OK``; 404 for an unknown
check or a wrong token alike (a guess learns nothing about which checks exist); 400 for a URL
or value that is not one of the above; 413 for a body over the limit; nothing is written for
any of those. The access log names the check, never the token.

Why the standard library's threading server: a ping is one small request and one Redis round
trip or two, and the process has nothing else to serve; put a reverse proxy with TLS in front
of it on a public network (docs/heartbeats.md).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from celery_app.checks.heartbeat import MAX_PING_BODY, PingKind, PingRefused, ping

log = logging.getLogger(__name__)

#: Refusals answered 404: which of the two it was is not the caller's business.
_NOT_FOUND = {"uid", "token"}


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port), or ValueError saying what is allowed."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{bind!r} is not HOST:PORT (a port from 1 to 65535)")
    return host.strip("[]"), int(port)


def ping_path(uid: str, token: str) -> str:
    """The path a success ping of ``uid`` takes (``/start``, ``/fail`` or ``/<exit status>``
    appended for the others): what :func:`route` reads."""
    return f"/ping/{quote(uid, safe='')}/{quote(token, safe='')}"


def route(path: str) -> tuple[str, str, str, int | None, float | None]:
    """(uid, token, kind, exit status, duration) of a ping URL, or ValueError."""
    parts = urlsplit(path)
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if len(segments) not in (3, 4) or segments[0] != "ping":
        raise ValueError("not a ping URL: /ping/<uid>/<token>[/start|/fail|/<exit status>]")
    uid, token = segments[1], segments[2]
    kind, exit_status = PingKind.SUCCESS.value, None
    if len(segments) == 4:
        last = segments[3]
        if last in (PingKind.START, PingKind.FAIL):
            kind = last
        elif last.isdigit() and len(last) <= 10:
            exit_status = int(last)
            kind = PingKind.SUCCESS.value if exit_status == 0 else PingKind.FAIL.value
        else:
            raise ValueError(f"{last!r} is not start, fail or an exit status (0 to 4294967295)")
    duration = None
    query = parse_qs(parts.query)
    if "duration" in query:
        try:
            duration = float(query["duration"][-1])
        except ValueError:
            raise ValueError("duration must be a number of seconds") from None
    return uid, token, kind, exit_status, duration


def make_handler(app: Any) -> type[BaseHTTPRequestHandler]:
    class PingHandler(BaseHTTPRequestHandler):
        server_version = "checkbeat-pings"

        def _answer(self, status: HTTPStatus, text: str) -> None:
            data = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _ping(self, body: str) -> None:
            try:
                uid, token, kind, exit_status, duration = route(self.path)
            except ValueError as exc:
                self._answer(HTTPStatus.BAD_REQUEST, str(exc))
                return
            try:
                ping(
                    app, uid, kind, exit_status=exit_status, duration_s=duration, body=body,
                    token=token,
                )  # fmt: skip
            except PingRefused as exc:
                if exc.field in _NOT_FOUND:
                    self._answer(HTTPStatus.NOT_FOUND, "no such check, or a wrong token")
                else:
                    self._answer(HTTPStatus.BAD_REQUEST, str(exc))
                return
            self._answer(HTTPStatus.OK, "OK")

        def do_GET(self) -> None:  # http.server's name
            self._ping("")

        def do_HEAD(self) -> None:
            self._ping("")

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._answer(HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
                return
            if length < 0 or length > MAX_PING_BODY:
                self._answer(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a body of at most {MAX_PING_BODY} bytes"
                )
                self.close_connection = True
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            self._ping(body)

        def log_message(self, format: str, *args: Any) -> None:  # http.server's
            uid = self.path.split("/")[2] if self.path.count("/") >= 2 else "-"
            log.info("ping %s %s -> %s", self.command, uid[:100], args[1] if len(args) > 1 else "")

    return PingHandler


def make_server(app: Any, host: str, port: int) -> ThreadingHTTPServer:
    """The ping server, bound (port 0: any free one), not yet serving."""
    server = ThreadingHTTPServer((host, port), make_handler(app))
    server.daemon_threads = True
    return server


def serve(app: Any, host: str, port: int) -> None:
    """Serve pings until interrupted."""
    server = make_server(app, host, port)
    log.info("checkbeat: serving heartbeat pings on %s:%d", host, server.server_address[1])
    print(f"serving heartbeat pings on http://{host}:{server.server_address[1]}/ping/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
