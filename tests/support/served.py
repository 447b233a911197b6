"""An HTTP server of the tests on 127.0.0.1, served from a daemon thread for a ``with`` block.

The receivers and targets (``notify_receivers.HttpReceiver``, ``flip_server.FlipServer``,
``recording_server.RecordingServer``) differ in what they answer; how they start and stop is
this.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Self


class ServedInThread:
    """Entering starts the server's thread; leaving shuts the server down, closes its socket and
    joins the thread. A subclass builds its server, then calls :meth:`_serve` with it."""

    _server: ThreadingHTTPServer
    _thread: threading.Thread

    def _serve(self, server: ThreadingHTTPServer, poll_interval: float = 0.5) -> None:
        server.daemon_threads = True  # a request in flight never holds the test's exit
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            args=(poll_interval,),
            name=type(self).__name__,
            daemon=True,
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
