"""The http probe's own transport (workers/probes/http_exchange.py) against real servers on
127.0.0.1: what it sends, how it follows redirects, and how it reads and decodes a body."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from celery_app.errors import CheckFieldError
from workers.deadline import Deadline
from workers.probes.http import MAX_BODY_BYTES, http_probe, tls_context, validate_http_config
from workers.probes.http_exchange import Hop, fetch
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy

OPEN = AddressPolicy(allow_private=True)
Route = Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


class Site:
    """A real HTTP/1.1 server whose paths answer from ``routes``; it records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        #: method, path, headers (names in lower case, each with every value it was sent with)
        self.seen: list[tuple[str, str, dict[str, list[str]]]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                sent: dict[str, list[str]] = {}
                for name, value in self.headers.items():
                    sent.setdefault(name.lower(), []).append(value)
                site.seen.append((self.command, self.path, sent))
                route = site.routes.get(self.path.split("?")[0])
                status, headers, body = route(self) if route else (404, {}, b"no route")
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_HEAD = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def headers_of(self, path: str) -> dict[str, str]:
        """The headers of the first request for ``path`` (each sent once: asserted)."""
        sent = next(h for _, p, h in self.seen if p == path)
        assert all(len(values) == 1 for values in sent.values()), sent
        return {name: values[0] for name, values in sent.items()}


@pytest.fixture
def site() -> Iterator[Site]:
    yield from _serve()


@pytest.fixture
def other() -> Iterator[Site]:
    yield from _serve()


def _serve() -> Iterator[Site]:
    site = Site()
    threading.Thread(target=site.server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield site
    finally:
        site.server.shutdown()
        site.server.server_close()


def probe(url: str, config: dict | None = None, timeout_s: float = 5.0):  # type: ignore[no-untyped-def]
    return http_probe(url, config or {}, ProbeContext(timeout_s, OPEN))


def test_a_probe_sends_its_defaults_the_checks_headers_and_the_urls_credentials(site):
    site.routes["/"] = lambda h: (200, {}, b"ok")
    result = probe(site.url("/").replace("//", "//bob:s%40cret@", 1), {"headers": {"X-Key": "1"}})
    assert result.ok, result
    sent = site.headers_of("/")
    assert sent["host"] == f"127.0.0.1:{site.port}"
    assert sent["user-agent"] == "checkbeat-probe/1"
    assert sent["accept-encoding"] == "gzip, deflate"
    assert sent["x-key"] == "1"
    assert sent["authorization"] == "Basic Ym9iOnNAY3JldA=="  # bob:s@cret
    site.seen.clear()
    overridden = probe(site.url("/"), {"headers": {"user-agent": "mine"}})
    assert overridden.ok
    assert site.headers_of("/")["user-agent"] == "mine"  # sent once: the check's


def test_a_target_with_a_space_or_non_ascii_is_sent_percent_encoded(site):
    site.routes["/a%20b/%C3%A9"] = lambda h: (200, {}, b"ok")
    result = probe(site.url("/a b/é?q=1"))
    assert result.ok, result
    assert site.seen[-1][1] == "/a%20b/%C3%A9?q=1"


def test_gzip_and_deflate_bodies_are_judged_decoded(site):
    text = b"hello from a compressed page"
    site.routes["/gz"] = lambda h: (200, {"Content-Encoding": "gzip"}, gzip.compress(text))
    site.routes["/zlib"] = lambda h: (200, {"Content-Encoding": "deflate"}, zlib.compress(text))
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # deflate without zlib's header
    raw_body = raw.compress(text) + raw.flush()
    site.routes["/raw"] = lambda h: (200, {"Content-Encoding": "deflate"}, raw_body)
    for path in ("/gz", "/zlib", "/raw"):
        assert probe(site.url(path), {"body_contains": "compressed page"}).ok, path
        missing = probe(site.url(path), {"body_contains": "absent"})
        assert missing.error_class == "body", path


def test_a_body_that_is_not_what_its_encoding_says_is_a_body_failure(site):
    site.routes["/liar"] = lambda h: (200, {"Content-Encoding": "gzip"}, b"plain text")
    judged = probe(site.url("/liar"), {"body_contains": "plain"})
    assert judged.error_class == "body" and "not decoded" in (judged.error or ""), judged
    assert judged.detail["status_code"] == 200
    assert probe(site.url("/liar")).ok  # a body no rule reads is not decoded


def test_a_compressed_body_cannot_expand_past_the_cap(site):
    """50 MiB of zeros gzip to ~50 KB: the text judged stops at MAX_BODY_BYTES."""
    bomb = gzip.compress(b"\0" * (50 << 20))
    site.routes["/bomb"] = lambda h: (200, {"Content-Encoding": "gzip"}, bomb)
    deadline = Deadline(5.0)
    exchange = fetch(
        "GET", site.url("/bomb"), [], follow_redirects=True, policy=OPEN, tls=tls_context(None),
        deadline=deadline,
    )  # fmt: skip
    try:
        body = exchange.read_body(MAX_BODY_BYTES)
        text = exchange.text(body, MAX_BODY_BYTES)
    finally:
        exchange.close()
    assert len(body) == len(bomb) < MAX_BODY_BYTES
    assert len(text) == MAX_BODY_BYTES
    result = probe(site.url("/bomb"), {"body_contains": "x"})
    assert result.error_class == "body"


def test_a_redirect_carries_the_cookies_set_on_the_way_and_keeps_credentials_at_home(site, other):
    """Same origin: the credentials and the configured cookie go on, with the cookie the
    redirect set; another origin gets neither the credentials nor the configured cookie."""
    site.routes["/login"] = lambda h: (302, {"Location": "/home", "Set-Cookie": "s=1; Path=/"}, b"")
    site.routes["/home"] = lambda h: (307, {"Location": other.url("/away")}, b"")
    other.routes["/away"] = lambda h: (200, {}, b"ok")
    config = {"headers": {"Authorization": "Bearer t", "Cookie": "mine=2"}}
    result = probe(site.url("/login"), config)
    assert result.ok, result
    home = site.headers_of("/home")
    assert home["authorization"] == "Bearer t"
    assert home["cookie"] == "mine=2; s=1"
    away = other.headers_of("/away")
    assert "authorization" not in away
    assert away["cookie"] == "s=1"  # the jar's rules: a cookie's host does not name a port


#: Headers a key may travel in; every one is the check's own, so none may leave its origin.
KEY_HEADERS = {
    "Authorization": "Bearer a-token",
    "Proxy-Authorization": "Basic cHJveHk6cHc=",
    "X-Api-Key": "xak-1",
    "Api-Key": "ak-2",
    "X-Auth-Token": "xat-3",
    "X-Tenant-Custom": "custom-4",
    "Cookie": "mine=2",
}


def _hops(site, other):  # type: ignore[no-untyped-def]
    """/start -> /same (same origin) -> the other server's /away -> its /back -> site's /end:
    two servers on 127.0.0.1 on two ports are two origins."""
    site.routes["/start"] = lambda h: (302, {"Location": "/same"}, b"")
    site.routes["/same"] = lambda h: (307, {"Location": other.url("/away")}, b"")
    other.routes["/away"] = lambda h: (302, {"Location": "/back"}, b"")
    other.routes["/back"] = lambda h: (302, {"Location": site.url("/end")}, b"")
    site.routes["/end"] = lambda h: (200, {}, b"ok")


def test_no_header_of_the_check_follows_a_redirect_to_another_origin(site, other):
    """Every configured header (API-key ones, a custom one, a cookie) and the URL's credentials
    go to the target's origin, on its own redirects too; not to another origin, nor back to the
    first one from there (that hop's URL was the other origin's choice)."""
    _hops(site, other)
    result = probe(site.url("/start"), {"headers": KEY_HEADERS})
    assert result.ok, result
    lowered = {name.lower(): value for name, value in KEY_HEADERS.items()}
    for path in ("/start", "/same"):
        sent = site.headers_of(path)
        assert {name: sent.get(name) for name in lowered} == lowered, path
    for server, path in ((other, "/away"), (other, "/back"), (site, "/end")):
        sent = server.headers_of(path)
        assert not set(lowered) & set(sent), (path, sent)
        assert sent["user-agent"] == "checkbeat-probe/1"  # the defaults still go
    site.seen.clear()
    other.seen.clear()
    with_password = site.url("/start").replace("//", "//bob:pw-in-url@", 1)
    assert probe(with_password).ok
    assert site.headers_of("/same")["authorization"].startswith("Basic ")
    assert "authorization" not in other.headers_of("/away")


def test_redirect_headers_all_sends_the_checks_headers_to_every_origin(site, other):
    _hops(site, other)
    config = {"headers": KEY_HEADERS, "redirect_headers": "all"}
    assert probe(site.url("/start").replace("//", "//bob:pw-in-url@", 1), config).ok
    away = other.headers_of("/away")
    for name, value in KEY_HEADERS.items():
        assert away[name.lower()] == value
    site.seen.clear()
    other.seen.clear()
    url_only = {"headers": {"X-Api-Key": "xak-1"}, "redirect_headers": "all"}
    assert probe(site.url("/start").replace("//", "//bob:pw-in-url@", 1), url_only).ok
    away = other.headers_of("/away")
    assert away["x-api-key"] == "xak-1"
    assert "authorization" not in away  # the URL's credentials belong to the URL's origin


@pytest.mark.parametrize("value", ["everywhere", True, None])
def test_redirect_headers_is_validated_at_write_naming_the_field(value):
    with pytest.raises(CheckFieldError) as refused:
        validate_http_config("http://127.0.0.1/", {"redirect_headers": value})
    assert refused.value.field == "config.redirect_headers"
    assert "same-origin" in str(refused.value) and "all" in str(refused.value)
    for allowed in ("same-origin", "all"):
        config = validate_http_config("http://127.0.0.1/", {"redirect_headers": allowed})
        assert config["redirect_headers"] == allowed


def test_303_and_302_turn_a_post_into_a_get_and_307_keeps_it(site):
    site.routes["/303"] = lambda h: (303, {"Location": "/done"}, b"")
    site.routes["/307"] = lambda h: (307, {"Location": "/done"}, b"")
    site.routes["/done"] = lambda h: (200, {}, b"ok")
    assert probe(site.url("/303"), {"method": "POST"}).ok
    assert probe(site.url("/307"), {"method": "POST"}).ok
    assert [(m, p) for m, p, _ in site.seen] == [
        ("POST", "/303"), ("GET", "/done"), ("POST", "/307"), ("POST", "/done"),
    ]  # fmt: skip


def test_redirects_past_the_limit_or_to_another_scheme_are_status_failures(site):
    site.routes["/loop"] = lambda h: (302, {"Location": "/loop"}, b"")
    site.routes["/ftp"] = lambda h: (302, {"Location": "ftp://127.0.0.1/x"}, b"")
    looped = probe(site.url("/loop"))
    assert (looped.error_class, looped.error) == (
        "status", "TooManyRedirects: more than 5 redirects"
    )  # fmt: skip
    assert len(site.seen) == 6  # the first request and five hops
    elsewhere = probe(site.url("/ftp"))
    assert elsewhere.error_class == "status"
    assert "ftp://127.0.0.1/x" in (elsewhere.error or "")


def test_a_redirect_without_a_location_is_the_response(site):
    site.routes["/r"] = lambda h: (302, {}, b"")
    result = probe(site.url("/r"))
    assert result.ok and result.detail["status_code"] == 302


def test_a_head_request_reads_no_body(site):
    site.routes["/head"] = lambda h: (200, {}, b"body")
    head = probe(site.url("/head"), {"method": "HEAD", "body_contains": "body"})
    assert head.error_class == "body"  # the body a GET would get was not read
    assert head.detail["status_code"] == 200 and site.seen[-1][0] == "HEAD"


def test_a_malformed_response_is_a_connect_failure():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def garbage() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    started = time.monotonic()
    bad = probe(f"http://127.0.0.1:{port}/")
    listener.close()
    assert bad.error_class == "connect" and "BadStatusLine" in (bad.error or "")
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    ("url", "host_header", "target"),
    [
        ("http://example.com", "example.com", "/"),
        ("https://example.com:8443/a?b=1#frag", "example.com:8443", "/a?b=1"),
        ("http://[2001:db8::1]:81/x", "[2001:db8::1]:81", "/x"),
        ("http://bücher.example/", "xn--bcher-kva.example", "/"),
    ],
)
def test_a_hop_is_split_once_into_what_goes_on_the_wire(url, host_header, target):
    hop = Hop.of(url)
    assert (hop.host_header, hop.target) == (host_header, target)
    assert "#" not in hop.url
