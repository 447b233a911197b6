"""Hostile probe targets on 127.0.0.1: real TCP servers (raw sockets, one thread a connection)
that drip, flood or stay silent, and listeners whose connects never complete.

The 0.3 s pauses between dripped bytes are the behaviour under test, not synchronisation: they
wait on the server's stop event, so ``stop()`` ends every handler at once.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

DRIP_INTERVAL_S = 0.3
HEADERS_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Connection:
    """What one handler did: bytes it managed to send, and why it ended."""

    sent: int = 0
    ended: threading.Event = field(default_factory=threading.Event)
    ended_by: str = ""
    ended_at: float | None = None


Behaviour = Callable[["HostileServer", socket.socket, Connection], None]


class HostileServer:
    """Accepts on 127.0.0.1 and runs ``behaviour(server, conn, record)`` per connection."""

    def __init__(self, behaviour: Behaviour, host: str = "127.0.0.1") -> None:
        self.behaviour = behaviour
        self.stop_event = threading.Event()
        self.connections: list[Connection] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, 0), backlog=16)
        self._listener.settimeout(0.05)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}{path}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = Connection()
            with self._lock:
                self.connections.append(record)
            thread = threading.Thread(
                target=self._handle, args=(conn, record), name="hostile-conn", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket, record: Connection) -> None:
        try:
            self.behaviour(self, conn, record)
            record.ended_by = record.ended_by or "done"
        except OSError as exc:  # the probe hung up: what a hostile server stops on
            record.ended_by = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        finally:
            record.ended_at = time.monotonic()
            record.ended.set()
            conn.close()

    def first_connection(self, timeout: float = 5.0) -> Connection:
        """The first connection's record, polled for until ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.connections:
                    return self.connections[0]
            time.sleep(0.005)
        raise AssertionError(f"no connection reached {self.address} within {timeout} s")

    def start(self) -> HostileServer:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._acceptor.join(5)
        self._listener.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- behaviours -------------------------------------------------------------------------------


def read_request(conn: socket.socket, limit: int = 65536) -> bytes:
    """Read until the end of the request head (the probes send no body)."""
    conn.settimeout(5.0)
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def drip(server: HostileServer, conn: socket.socket, record: Connection, data: bytes) -> None:
    """Send ``data`` one byte every :data:`DRIP_INTERVAL_S` until done, stopped or hung up on."""
    for i in range(len(data)):
        conn.sendall(data[i : i + 1])
        record.sent += 1
        if server.stop_event.wait(DRIP_INTERVAL_S):
            record.ended_by = "stopped"
            return


def drip_headers(server: HostileServer, conn: socket.socket, record: Connection) -> None:
    """A valid response whose status line and headers arrive one byte every 0.3 s."""
    read_request(conn)
    drip(server, conn, record, HEADERS_OK)


def drip_body(server: HostileServer, conn: socket.socket, record: Connection) -> None:
    """Headers at once (Content-Length: 100), then the body one byte every 0.3 s."""
    read_request(conn)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
    conn.sendall(head)
    record.sent += len(head)
    drip(server, conn, record, b"x" * 100)


#: What :func:`huge_body` announces and would send: 300 MB.
HUGE_BODY_BYTES = 300 * 1000 * 1000
#: The server's send buffer in :func:`huge_body`, kept small so "sent" is close to "read".
HUGE_SNDBUF = 64 * 1024


def huge_body(server: HostileServer, conn: socket.socket, record: Connection) -> None:
    """Headers, then a 300 MB body as fast as the socket takes it; stops when the send fails."""
    read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HUGE_SNDBUF)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        b"Content-Length: " + str(HUGE_BODY_BYTES).encode() + b"\r\n\r\n"
    )
    conn.sendall(head)
    block = b"a" * 65536
    conn.settimeout(10.0)
    while record.sent < HUGE_BODY_BYTES and not server.stop_event.is_set():
        record.sent += conn.send(block)


def silent(server: HostileServer, conn: socket.socket, record: Connection) -> None:
    """Accept, read what comes, never answer (until the probe hangs up or the test ends)."""
    conn.settimeout(0.05)
    while not server.stop_event.is_set():
        try:
            if not conn.recv(4096):
                record.ended_by = "closed by the probe"
                return
        except TimeoutError:
            continue


def tls_drip(server: HostileServer, conn: socket.socket, record: Connection) -> None:
    """Read the ClientHello, then drip a TLS handshake record header and body a byte at a time
    (a valid-looking 16 KiB record that never completes)."""
    conn.settimeout(5.0)
    conn.recv(4096)
    drip(server, conn, record, b"\x16\x03\x03\x40\x00" + b"\x02" * 0x4000)


# --- connects that never complete -------------------------------------------------------------


def patch_resolver(monkeypatch) -> dict:
    """Resolve names from a table in this process: returns the table, ``name -> [addresses]``
    (IPv4, any port) or ``name -> callable(host, port)`` (which may block or raise). Other names
    resolve as usual. Patches ``socket.getaddrinfo``, the probes' one lookup (also when it runs
    in the target guard's helper thread); ``monkeypatch`` undoes it."""
    table: dict = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in table:
            answer = table[host]
            if callable(answer):
                return answer(host, port)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answer]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@contextmanager
def black_holes(count: int, first: int = 10) -> Iterator[tuple[list[str], int]]:
    """``count`` loopback addresses (127.0.0.<first>...) sharing one port where a TCP connect
    never completes: (addresses, port).

    How: each is a listener with ``listen(0)`` whose one-slot accept queue is already taken by
    a connection nobody accepts. Linux then drops further SYNs (ListenOverflows), so a connect
    waits for its timeout exactly as for a black-holed remote address, without any network
    beyond the loopback interface.
    """
    listeners: list[socket.socket] = []
    fillers: list[socket.socket] = []
    addresses = [f"127.0.0.{first + i}" for i in range(count)]
    try:
        port = 0
        for attempt in range(20):
            for sock in listeners:
                sock.close()
            listeners.clear()
            try:
                for address in addresses:
                    sock = socket.socket()
                    listeners.append(sock)
                    sock.bind((address, port))
                    port = sock.getsockname()[1]
                break
            except OSError:
                port = 0  # the port was taken on one of the addresses: pick another
                if attempt == 19:
                    raise
        for sock, address in zip(listeners, addresses, strict=True):
            sock.listen(0)
            filler = socket.create_connection((address, port), timeout=2.0)
            fillers.append(filler)
        # prove the hole: a further connect does not complete
        for address in addresses[:1]:
            probe = socket.socket()
            probe.settimeout(0.2)
            try:
                probe.connect((address, port))
            except TimeoutError:
                pass
            else:
                raise AssertionError(f"{address}:{port} accepted a connect: not a black hole")
            finally:
                probe.close()
        yield addresses, port
    finally:
        for sock in fillers + listeners:
            sock.close()


def answering(head: bytes, body: bytes) -> Behaviour:
    """A behaviour that answers every request with ``head`` (status line and headers, without
    Content-Length or the blank line) and ``body``."""

    def answer(server: HostileServer, conn: socket.socket, record: Connection) -> None:
        read_request(conn)
        conn.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        record.sent += len(body)

    return answer


#: The response head of :func:`many_headers`: 1,000 headers (``http.client`` reads 100 at most).
MANY_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: %d\r\n" % (i, i) for i in range(1000))
many_headers = answering(MANY_HEADERS, b"ok")


def redirecting(location: Callable[[], str]) -> Behaviour:
    """A behaviour that answers every request with a 302 to ``location()``."""

    def redirect(server: HostileServer, conn: socket.socket, record: Connection) -> None:
        read_request(conn)
        conn.sendall(
            f"HTTP/1.1 302 Found\r\nLocation: {location()}\r\nContent-Length: 0\r\n\r\n".encode()
        )

    return redirect
