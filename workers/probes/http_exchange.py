"""One HTTP/1.1 request and its redirects, over connections to vetted addresses only, within the
run's deadline: the transport of the ``http`` probe.

Why the stdlib's ``http.client`` and not httpx: the probe is the largest part of a run's worker
CPU, and one GET through ``http.client`` on a socket of ours costs well under half the CPU of
one through a shared httpx client (``bench/http_client_bench.py``). ``http.client``
writes the request line and headers (validating them) and parses the status line, headers and
body framing (length, chunked). This module owns only what a probe must control itself:

- **which address is connected**: the name is resolved and every answer vetted
  (:func:`workers.target_guard.connect_vetted`), and the socket is connected to the vetted
  address; there is no second lookup for a rebinding DNS server to answer differently;
- **one deadline over every socket operation**: the connect, the TLS handshake, each write and
  each read get what is left of the run's budget (:class:`DeadlineSocket`), so a server that
  drips its headers or body a byte at a time is cut off at the deadline;
- **redirects one hop at a time**: a redirect's body is never read (the connection is closed);
  once a redirect leaves the first URL's origin (scheme, host, port) the request goes on with
  the headers the caller gave for other origins (the http probe: none of the check's own, unless
  its ``redirect_headers`` says ``all``), so a key in any header stays with the origin it was
  configured for; the cookies the redirects set are sent on the next hops (by the stdlib's cookie
  rules); at most :data:`MAX_REDIRECTS` hops.

No connection outlives its run and no proxy from the environment is used (a proxy would connect
for us).
"""

from __future__ import annotations

import codecs
import http.client
import http.cookiejar
import io
import socket
import ssl
import urllib.request
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from celery_app.errors import CheckbeatError
from workers.deadline import Deadline, DeadlineExceeded
from workers.target_guard import AddressPolicy, IPAddress, connect_vetted

MAX_REDIRECTS = 5
#: Largest piece handed to one socket write, so a stalled send cannot outlive the deadline.
WRITE_PIECE_BYTES = 16 * 1024
#: Most bytes asked of one socket read of the body.
READ_PIECE_BYTES = 64 * 1024
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Content codings undone at most (each to the body cap): ``gzip`` or ``deflate``, and one more.
MAX_CONTENT_CODINGS = 2
#: The charsets a body is decoded with (Python's codec names); any other is read as UTF-8.
SAFE_CHARSETS = frozenset(
    codecs.lookup(name).name
    for name in (
        *("utf-8", "utf-8-sig", "ascii", "latin-1"),
        *("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"),
        *(f"iso8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16)),
        *(f"cp{n}" for n in range(1250, 1259)),
        *("cp874", "koi8-r", "koi8-u", "mac-roman", "cp437", "cp850", "cp866"),
        *("shift_jis", "euc-jp", "iso2022-jp", "gb2312", "gbk", "gb18030", "big5", "euc-kr"),
    )
)
#: Characters a request target keeps as they are; anything else (a space, non-ASCII) is
#: percent-encoded, as a browser would send it.
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"


class ConnectTimeout(CheckbeatError, TimeoutError):
    """No vetted address accepted a connection, or the TLS handshake did not finish, in time."""


class ReadTimeout(CheckbeatError, TimeoutError):
    """The response (status line, headers or body) did not arrive within the deadline."""


class WriteTimeout(CheckbeatError, TimeoutError):
    """The request could not be sent within the deadline."""


class BodyNotDecoded(CheckbeatError, ValueError):
    """The body's Content-Encoding says gzip or deflate, but it is not."""


class TooManyRedirects(CheckbeatError, Exception):
    """More than :data:`MAX_REDIRECTS` redirects."""


class RedirectRefused(CheckbeatError, Exception):
    """A redirect to somewhere a probe does not go (not http or https, no host)."""


class DeadlineSocket:
    """A connected socket whose every send and receive is bounded by the run's deadline: what
    ``http.client`` writes the request to and reads the response from."""

    __slots__ = ("_deadline", "sock")

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self.sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), WRITE_PIECE_BYTES):
            try:
                self.sock.settimeout(self._deadline.bound(what="sending the request"))
                self.sock.sendall(view[start : start + WRITE_PIECE_BYTES])
            except TimeoutError as exc:
                raise WriteTimeout(self._late("sending the request", exc)) from None

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        try:
            self.sock.settimeout(self._deadline.bound(what="reading the response"))
            return self.sock.recv_into(buffer, nbytes) if nbytes else self.sock.recv_into(buffer)
        except TimeoutError as exc:
            raise ReadTimeout(self._late("reading the response", exc)) from None

    def makefile(self, mode: str = "rb", *_: Any, **__: Any) -> io.BufferedReader:
        """What ``http.client.HTTPResponse`` reads through (it asks for ``"rb"`` only)."""
        return io.BufferedReader(_SocketReader(self))

    def close(self) -> None:
        self.sock.close()

    def _late(self, what: str, exc: TimeoutError) -> str:
        if isinstance(exc, DeadlineExceeded):
            return str(exc)
        return f"{what} did not finish within {self._deadline.timeout_s:g} s"


class _SocketReader(io.RawIOBase):
    """The raw stream under ``http.client``'s buffered reader: every read one bounded recv."""

    def __init__(self, sock: DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)


@dataclass(frozen=True)
class Hop:
    """Where one request goes: the URL without credentials, split once."""

    url: str
    scheme: str
    host: str
    port: int
    host_header: str
    target: str

    @classmethod
    def of(cls, url: str) -> Hop:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RedirectRefused(f"not an http(s) URL with a host: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        hostport = netloc = parts.netloc.rpartition("@")[2]  # never the credentials
        if not hostport.isascii():  # an internationalised name: its ASCII form on the wire
            ascii_host = parts.hostname.encode("idna").decode("ascii")
            hostport = ascii_host if parts.port is None else f"{ascii_host}:{parts.port}"
        target = parts.path or "/"
        if parts.query:
            target = f"{target}?{parts.query}"
        if not target.isascii() or " " in target:
            target = quote(target, safe=_TARGET_SAFE)
        clean = urlunsplit(parts._replace(netloc=netloc, fragment=""))
        return cls(clean, parts.scheme, parts.hostname, port, hostport, target)

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port


class Exchange:
    """The final response of a request (redirects followed), on the connection it came on."""

    def __init__(
        self, response: http.client.HTTPResponse, sock: DeadlineSocket, address: IPAddress
    ) -> None:
        self.response = response
        self.address = address
        self._sock = sock
        #: Whether :meth:`text` stopped a decompression at its limit (the rest is not judged).
        self.cut = False

    @property
    def status_code(self) -> int:
        return self.response.status

    @property
    def ssl_object(self) -> ssl.SSLSocket | None:
        """The TLS connection the response came on (None for http)."""
        sock = self._sock.sock
        return sock if isinstance(sock, ssl.SSLSocket) else None

    def read_body(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body as sent (undecoded); stops there, the rest is not
        read. Every read is bounded by the deadline (ReadTimeout past it)."""
        body = bytearray()
        while len(body) < limit:
            chunk = self.response.read1(min(READ_PIECE_BYTES, limit - len(body)))
            if not chunk:
                break
            body += chunk
        return bytes(body)

    def text(self, body: bytes, limit: int) -> str:
        """``body`` decoded (its Content-Encoding, then its charset, UTF-8 by default) to at most
        ``limit`` bytes before the charset: a compressed body cannot expand past the cap.
        BodyNotDecoded when it is not what its Content-Encoding says, or lists more than
        :data:`MAX_CONTENT_CODINGS`. The charset is the server's only if it is one of
        :data:`SAFE_CHARSETS` (see :func:`safe_charset`)."""
        codings = _codings(self.response.getheader("Content-Encoding"))
        if len(codings) > MAX_CONTENT_CODINGS:
            raise BodyNotDecoded(
                f"Content-Encoding lists {len(codings)} codings; at most "
                f"{MAX_CONTENT_CODINGS} are undone"
            )
        try:
            for coding in reversed(codings):
                body = _decompress(body, coding, limit)
                self.cut = self.cut or len(body) >= limit
        except zlib.error as exc:
            raise BodyNotDecoded(f"Content-Encoding {', '.join(codings)}: {exc}") from None
        return body.decode(safe_charset(self.response.msg.get_content_charset()), "replace")

    def close(self) -> None:
        """Hang up: what was not read is not downloaded."""
        self.response.close()
        self._sock.close()


def safe_charset(charset: str | None) -> str:
    """The codec a body is decoded with: ``charset`` if it names one of :data:`SAFE_CHARSETS`,
    else UTF-8 (with replacement characters for what is not UTF-8).

    Why a list: the server chooses the charset, and some of Python's codecs are pure Python and
    superlinear (``punycode`` took 21 s for 1 MiB) or are not text encodings at all; every
    codec on the list is implemented in C and linear in the body.
    """
    if not charset:
        return "utf-8"
    try:
        name = codecs.lookup(charset).name
    except (LookupError, ValueError):  # a charset Python does not know, or not a name at all
        return "utf-8"
    return name if name in SAFE_CHARSETS else "utf-8"


def _codings(header: str | None) -> list[str]:
    return [c.strip().lower() for c in (header or "").split(",") if c.strip()]


def _decompress(body: bytes, coding: str, limit: int) -> bytes:
    """One content coding undone (gzip, deflate; others are left as they are), to ``limit``."""
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, limit)
    if coding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send it
        try:
            return zlib.decompressobj().decompress(body, limit)
        except zlib.error:
            return zlib.decompressobj(-zlib.MAX_WBITS).decompress(body, limit)
    return body


def _connect(hop: Hop, policy: AddressPolicy, tls: ssl.SSLContext, deadline: Deadline) -> Any:
    """A socket to a vetted address of ``hop``'s host, TLS-wrapped for https (verified against
    the host's name), within ``deadline``; and the address."""
    try:
        sock, address = connect_vetted(
            hop.host, hop.port, deadline.timeout_s, policy, deadline=deadline
        )
    except TimeoutError as exc:
        raise ConnectTimeout(str(exc)) from None
    if hop.scheme == "https":
        try:
            # CPython bounds a whole handshake by the socket timeout (not each recv of it).
            sock.settimeout(deadline.bound(what="the TLS handshake"))
            sock = tls.wrap_socket(sock, server_hostname=hop.host)
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeout(
                str(exc)
                if isinstance(exc, DeadlineExceeded)
                else f"the TLS handshake did not finish within {deadline.timeout_s:g} s"
            ) from None
        except BaseException:
            sock.close()
            raise
    return DeadlineSocket(sock, deadline), address


def _send(hop: Hop, method: str, headers: Iterable[tuple[str, str]], sock: DeadlineSocket) -> Any:
    """Write the request (``http.client`` validates the target and every header) and read the
    response's status line and headers."""
    writer = http.client.HTTPConnection(hop.host, hop.port)
    writer.sock = sock  # it only calls sendall
    writer.putrequest(method, hop.target, skip_host=True, skip_accept_encoding=True)
    writer.putheader("Host", hop.host_header)
    for name, value in headers:
        writer.putheader(name, value)
    writer.endheaders()
    response = http.client.HTTPResponse(sock, method=method)  # type: ignore[arg-type]  # a socket-like
    response.begin()
    return response


def _next_method(status: int, method: str) -> str:
    """The method of the request after a redirect: what browsers (and httpx) do."""
    if status == 303 and method != "HEAD":
        return "GET"
    if status == 302 and method != "HEAD":
        return "GET"
    if status == 301 and method == "POST":
        return "GET"
    return method


def fetch(
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    *,
    elsewhere: list[tuple[str, str]] | None = None,
    follow_redirects: bool,
    policy: AddressPolicy,
    tls: ssl.SSLContext,
    deadline: Deadline,
) -> Exchange:
    """Request ``url`` (without credentials: they go in ``headers``) and follow its redirects,
    all within ``deadline``; the caller reads the final body and closes the exchange.

    ``headers`` go to ``url``'s origin (and on a same-origin redirect); from the first redirect
    to another origin on, every hop gets ``elsewhere`` instead (default: no header at all
    besides Host and the redirects' cookies). Once left, the origin's headers do not come back
    on a later hop, even to the first origin: that hop's URL was chosen by the other origin.

    Raises ResolutionFailed, TargetRefused, ConnectTimeout, ReadTimeout, WriteTimeout,
    TooManyRedirects, RedirectRefused, ``ssl.SSLError``, ``http.client.HTTPException`` or
    ``OSError``.
    """
    hop = Hop.of(url)
    jar: http.cookiejar.CookieJar | None = None
    hops = 0
    sent = headers
    while True:
        sock, address = _connect(hop, policy, tls, deadline)
        try:
            response = _send(hop, method, sent, sock)
        except BaseException:
            sock.close()
            raise
        location = response.getheader("Location")
        if not (follow_redirects and response.status in REDIRECT_STATUSES and location):
            return Exchange(response, sock, address)
        if response.msg.get_all("Set-Cookie"):
            jar = jar or http.cookiejar.CookieJar()
            jar.extract_cookies(response, urllib.request.Request(hop.url))
        response.close()  # the redirect's body is not read
        sock.close()
        hops += 1
        if hops > MAX_REDIRECTS:
            raise TooManyRedirects(f"more than {MAX_REDIRECTS} redirects")
        previous, hop = hop, Hop.of(urljoin(hop.url, location.strip()))
        method = _next_method(response.status, method)
        if not _same_origin(previous, hop):
            headers = list(elsewhere or ())
        sent = headers if jar is None else _with_cookies(headers, jar, hop)


def _same_origin(before: Hop, after: Hop) -> bool:
    """Whether headers given for ``before`` may go to ``after``: the same origin, or the same
    host moving from http on 80 to https on 443 (as httpx allows)."""
    if before.origin == after.origin:
        return True
    upgrade = (before.scheme, before.port, after.scheme, after.port) == ("http", 80, "https", 443)
    return upgrade and before.origin[1] == after.origin[1]


def _with_cookies(
    headers: list[tuple[str, str]], jar: http.cookiejar.CookieJar, hop: Hop
) -> list[tuple[str, str]]:
    """``headers`` with the cookies the redirects set for ``hop`` added to its Cookie header."""
    request = urllib.request.Request(hop.url)
    jar.add_cookie_header(request)
    cookies = request.get_header("Cookie")
    if not cookies:
        return headers
    configured = [v for n, v in headers if n.lower() == "cookie"]
    rest = [(n, v) for n, v in headers if n.lower() != "cookie"]
    return [*rest, ("Cookie", "; ".join([*configured, cookies]))]
