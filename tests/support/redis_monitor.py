"""Every command a redis-server receives, from any client and any db (``MONITOR``), kept as the
raw lines the server sends, with the base64 pieces in them decoded (kombu sends a message body
base64-encoded): what the broker and the state store were given to carry."""

from __future__ import annotations

import base64
import binascii
import re
import threading

import redis

_BASE64 = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")


class RedisMonitor:
    def __init__(self, port: int, password: str | None = None) -> None:
        self._monitor = redis.Redis(port=port, password=password).monitor()
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)

    def _read(self) -> None:
        connection = self._monitor.connection
        try:
            while True:
                reply = connection.read_response()
                if isinstance(reply, bytes):
                    reply = reply.decode("utf-8", "replace")
                self.lines.append(str(reply))
        except (redis.ConnectionError, OSError, ValueError, AttributeError):
            return  # stopped: the connection was closed

    def __enter__(self) -> RedisMonitor:
        self._monitor.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._monitor.__exit__()
        self._thread.join(5)

    def texts(self) -> list[str]:
        """Each line, and after it each base64 piece of it that decodes to text."""
        out: list[str] = []
        for line in list(self.lines):
            out.append(line)
            for piece in _BASE64.findall(line):
                try:
                    out.append(base64.b64decode(piece + "=" * (-len(piece) % 4)).decode())
                except (binascii.Error, UnicodeDecodeError):
                    continue
        return out
