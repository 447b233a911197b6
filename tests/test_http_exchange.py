"""The http probe's own transport (workers/probes/http_exchange.py) against real servers on
127.0.0.1: what it sends, how it follows redirects, and how it reads and decodes a body."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib

import pytest

from celery_app.errors import CheckFieldError
from workers.deadline import Deadline
from workers.probes.http import MAX_BODY_BYTES, http_probe, tls_context, validate_http_config
from workers.probes.http_exchange import Hop, fetch
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy

OPEN = AddressPolicy(allow_private=True)


def probe(url: str, config: dict | None = None, timeout_s: float = 5.0):
    return http_probe(url, config or {}, ProbeContext(timeout_s, OPEN))


def test_a_probe_sends_its_defaults_the_checks_headers_and_the_urls_credentials(content_server):
    content_server.answer("/", 200, {}, b"ok")
    result = probe(
        content_server.url("/").replace("//", "//bob:s%40cret@", 1), {"headers": {"X-Key": "1"}}
    )
    assert result.ok, result
    sent = content_server.headers_of("/")
    assert sent["host"] == f"127.0.0.1:{content_server.port}"
    assert sent["user-agent"] == "checkbeat-probe/1"
    assert sent["accept-encoding"] == "gzip, deflate"
    assert sent["x-key"] == "1"
    assert sent["authorization"] == "Basic Ym9iOnNAY3JldA=="  # bob:s@cret
    content_server.seen.clear()
    overridden = probe(content_server.url("/"), {"headers": {"user-agent": "mine"}})
    assert overridden.ok
    assert content_server.headers_of("/")["user-agent"] == "mine"  # sent once: the check's


def test_a_target_with_a_space_or_non_ascii_is_sent_percent_encoded(content_server):
    content_server.answer("/a%20b/%C3%A9", 200, {}, b"ok")
    result = probe(content_server.url("/a b/é?q=1"))
    assert result.ok, result
    assert content_server.seen[-1][1] == "/a%20b/%C3%A9?q=1"


def test_gzip_and_deflate_bodies_are_judged_decoded(content_server):
    text = b"hello from a compressed page"
    content_server.answer("/gz", 200, {"Content-Encoding": "gzip"}, gzip.compress(text))
    content_server.answer("/zlib", 200, {"Content-Encoding": "deflate"}, zlib.compress(text))
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # deflate without zlib's header
    raw_body = raw.compress(text) + raw.flush()
    content_server.answer("/raw", 200, {"Content-Encoding": "deflate"}, raw_body)
    for path in ("/gz", "/zlib", "/raw"):
        assert probe(content_server.url(path), {"body_contains": "compressed page"}).ok, path
        missing = probe(content_server.url(path), {"body_contains": "absent"})
        assert missing.error_class == "body", path


def test_a_body_that_is_not_what_its_encoding_says_is_a_body_failure(content_server):
    content_server.answer("/liar", 200, {"Content-Encoding": "gzip"}, b"plain text")
    judged = probe(content_server.url("/liar"), {"body_contains": "plain"})
    assert judged.error_class == "body" and "not decoded" in (judged.error or ""), judged
    assert judged.detail["status_code"] == 200
    assert probe(content_server.url("/liar")).ok  # a body no rule reads is not decoded


def test_a_compressed_body_cannot_expand_past_the_cap(content_server):
    """50 MiB of zeros gzip to ~50 KB: the text judged stops at MAX_BODY_BYTES."""
    bomb = gzip.compress(b"\0" * (50 << 20))
    content_server.answer("/bomb", 200, {"Content-Encoding": "gzip"}, bomb)
    deadline = Deadline(5.0)
    exchange = fetch(
        "GET", content_server.url("/bomb"), [], follow_redirects=True, policy=OPEN,
        tls=tls_context(None), deadline=deadline,
    )  # fmt: skip
    try:
        body = exchange.read_body(MAX_BODY_BYTES)
        text = exchange.text(body, MAX_BODY_BYTES)
    finally:
        exchange.close()
    assert len(body) == len(bomb) < MAX_BODY_BYTES
    assert len(text) == MAX_BODY_BYTES
    result = probe(content_server.url("/bomb"), {"body_contains": "x"})
    assert result.error_class == "body"


def test_a_redirect_carries_the_cookies_set_on_the_way_and_keeps_credentials_at_home(
    content_server, other_server
):
    """Same origin: the credentials and the configured cookie go on, with the cookie the
    redirect set; another origin gets neither the credentials nor the configured cookie."""
    content_server.answer("/login", 302, {"Location": "/home", "Set-Cookie": "s=1; Path=/"}, b"")
    content_server.answer("/home", 307, {"Location": other_server.url("/away")}, b"")
    other_server.answer("/away", 200, {}, b"ok")
    config = {"headers": {"Authorization": "Bearer t", "Cookie": "mine=2"}}
    result = probe(content_server.url("/login"), config)
    assert result.ok, result
    home = content_server.headers_of("/home")
    assert home["authorization"] == "Bearer t"
    assert home["cookie"] == "mine=2; s=1"
    away = other_server.headers_of("/away")
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


def _hops(content_server, other_server):
    """/start -> /same (same origin) -> the other server's /away -> its /back -> site's /end:
    two servers on 127.0.0.1 on two ports are two origins."""
    content_server.answer("/start", 302, {"Location": "/same"}, b"")
    content_server.answer("/same", 307, {"Location": other_server.url("/away")}, b"")
    other_server.answer("/away", 302, {"Location": "/back"}, b"")
    other_server.answer("/back", 302, {"Location": content_server.url("/end")}, b"")
    content_server.answer("/end", 200, {}, b"ok")


def test_no_header_of_the_check_follows_a_redirect_to_another_origin(content_server, other_server):
    """Every configured header (API-key ones, a custom one, a cookie) and the URL's credentials
    go to the target's origin, on its own redirects too; not to another origin, nor back to the
    first one from there (that hop's URL was the other origin's choice)."""
    _hops(content_server, other_server)
    result = probe(content_server.url("/start"), {"headers": KEY_HEADERS})
    assert result.ok, result
    lowered = {name.lower(): value for name, value in KEY_HEADERS.items()}
    for path in ("/start", "/same"):
        sent = content_server.headers_of(path)
        assert {name: sent.get(name) for name in lowered} == lowered, path
    for server, path in (
        (other_server, "/away"),
        (other_server, "/back"),
        (content_server, "/end"),
    ):
        sent = server.headers_of(path)
        assert not set(lowered) & set(sent), (path, sent)
        assert sent["user-agent"] == "checkbeat-probe/1"  # the defaults still go
    content_server.seen.clear()
    other_server.seen.clear()
    with_password = content_server.url("/start").replace("//", "//bob:pw-in-url@", 1)
    assert probe(with_password).ok
    assert content_server.headers_of("/same")["authorization"].startswith("Basic ")
    assert "authorization" not in other_server.headers_of("/away")


def test_redirect_headers_all_sends_the_checks_headers_to_every_origin(
    content_server, other_server
):
    _hops(content_server, other_server)
    config = {"headers": KEY_HEADERS, "redirect_headers": "all"}
    assert probe(content_server.url("/start").replace("//", "//bob:pw-in-url@", 1), config).ok
    away = other_server.headers_of("/away")
    for name, value in KEY_HEADERS.items():
        assert away[name.lower()] == value
    content_server.seen.clear()
    other_server.seen.clear()
    url_only = {"headers": {"X-Api-Key": "xak-1"}, "redirect_headers": "all"}
    assert probe(content_server.url("/start").replace("//", "//bob:pw-in-url@", 1), url_only).ok
    away = other_server.headers_of("/away")
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


def test_303_and_302_turn_a_post_into_a_get_and_307_keeps_it(content_server):
    content_server.answer("/303", 303, {"Location": "/done"}, b"")
    content_server.answer("/307", 307, {"Location": "/done"}, b"")
    content_server.answer("/done", 200, {}, b"ok")
    assert probe(content_server.url("/303"), {"method": "POST"}).ok
    assert probe(content_server.url("/307"), {"method": "POST"}).ok
    assert [(m, p) for m, p, _ in content_server.seen] == [
        ("POST", "/303"), ("GET", "/done"), ("POST", "/307"), ("POST", "/done"),
    ]  # fmt: skip


def test_redirects_past_the_limit_or_to_another_scheme_are_status_failures(content_server):
    content_server.answer("/loop", 302, {"Location": "/loop"}, b"")
    content_server.answer("/ftp", 302, {"Location": "ftp://127.0.0.1/x"}, b"")
    looped = probe(content_server.url("/loop"))
    assert (looped.error_class, looped.error) == (
        "status", "TooManyRedirects: more than 5 redirects"
    )  # fmt: skip
    assert len(content_server.seen) == 6  # the first request and five hops
    elsewhere = probe(content_server.url("/ftp"))
    assert elsewhere.error_class == "status"
    assert "ftp://127.0.0.1/x" in (elsewhere.error or "")


def test_a_redirect_without_a_location_is_the_response(content_server):
    content_server.answer("/r", 302, {}, b"")
    result = probe(content_server.url("/r"))
    assert result.ok and result.detail["status_code"] == 302


def test_a_head_request_reads_no_body(content_server):
    content_server.answer("/head", 200, {}, b"body")
    head = probe(content_server.url("/head"), {"method": "HEAD", "body_contains": "body"})
    assert head.error_class == "body"  # the body a GET would get was not read
    assert head.detail["status_code"] == 200 and content_server.seen[-1][0] == "HEAD"


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
