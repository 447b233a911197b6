"""Probe kinds and the private-target guard, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest
from support.http_target import BODY, DelayServer

from celery_app.checks.kinds import (
    check_kind,
    get_kind,
    registered_kinds,
    unregister_kind,
    validate_check_config,
)
from celery_app.errors import CheckFieldError
from celery_app.registry import SHARED
from celery_app.settings import load_settings
from workers.probes import (
    ProbeContext,
    http_probe,
    tcp_probe,
    validate_http_config,
    validate_tcp_config,
)
from workers.target_guard import AddressPolicy, TargetRefused, refusal_reason, resolve_vetted

OPEN = AddressPolicy(allow_private=True)
CLOSED = AddressPolicy(allow_private=False)


@pytest.fixture
def server() -> Iterator[DelayServer]:
    with DelayServer() as srv:
        yield srv


def ctx(timeout_s: float = 5.0, policy: AddressPolicy = OPEN) -> ProbeContext:
    return ProbeContext(timeout_s=timeout_s, policy=policy)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the guard ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("fd00:ec2::254", "metadata"),
        ("100.64.0.1", "non-public"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_guard_names_why_an_address_is_refused(address, reason):
    assert reason in refusal_reason(ipaddress.ip_address(address))


def test_guard_lets_public_addresses_through():
    assert refusal_reason(ipaddress.ip_address("8.8.8.8")) is None
    assert refusal_reason(ipaddress.ip_address("2606:4700:4700::1111")) is None


def test_a_name_resolving_to_loopback_is_refused_after_resolution():
    with pytest.raises(TargetRefused, match=r"localhost \(127\.0\.0\.1\) is a loopback"):
        resolve_vetted("localhost", 80, CLOSED)
    assert resolve_vetted("localhost", 80, OPEN) == [ipaddress.ip_address("127.0.0.1")]


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.7", "169.254.169.254", "localhost"])
def test_probes_refuse_private_targets_unless_allowed(server, host):
    url = f"http://{host}:{server.port}/delay/0"
    refused = http_probe(url, {}, ctx(policy=CLOSED))
    assert (refused.ok, refused.error_class) == (False, "refused")
    assert "CHECKBEAT_ALLOW_PRIVATE_TARGETS" in refused.error
    tcp = tcp_probe(f"{host}:{server.port}", {}, ctx(policy=CLOSED))
    assert tcp.error_class == "refused"
    assert server.hits("/delay/0") == 0  # nothing was sent


def test_allowed_private_target_is_reached(server):
    assert http_probe(server.url("/delay/0"), {}, ctx(policy=OPEN)).ok
    assert server.hits("/delay/0") == 1


def test_a_redirect_to_a_refused_address_is_refused_at_the_hop(server):
    """Redirects are re-vetted: the first hop is allowed, the second is not."""
    only_first = AddressPolicy(allowed=frozenset({ipaddress.ip_address("127.0.0.1")}))
    hop = f"http://127.0.0.2:{server.port}/delay/0"
    result = http_probe(server.url(f"/redirect?to={hop}"), {}, ctx(policy=only_first))
    assert result.error_class == "refused"
    assert "127.0.0.2" in result.error
    followed = http_probe(
        server.url(f"/redirect?to={server.url('/body')}"), {}, ctx(policy=only_first)
    )
    assert followed.ok, followed


def test_creation_refuses_a_literal_private_address_unless_allowed():
    with pytest.raises(CheckFieldError, match=r"target: target 10\.0\.0\.1 is a private address"):
        validate_http_config("http://10.0.0.1/", {}, CLOSED)
    with pytest.raises(CheckFieldError, match=r"target 169\.254\.169\.254 is a cloud metadata"):
        validate_tcp_config("169.254.169.254:80", {}, CLOSED)
    assert validate_http_config("http://10.0.0.1/", {}, OPEN)["method"] == "GET"


def test_registered_kinds_validate_under_the_settings_given(monkeypatch):
    assert {"http", "tcp"} <= set(registered_kinds(SHARED))
    assert get_kind(SHARED, "http").probe is http_probe
    # The environment says "allowed"; the settings in hand say "refused", and they decide.
    monkeypatch.setenv("CHECKBEAT_ALLOW_PRIVATE_TARGETS", "1")
    closed = load_settings(allow_private_targets=False)
    with pytest.raises(CheckFieldError) as refused:
        validate_check_config(SHARED, "tcp", "127.0.0.1:80", {}, closed)
    assert refused.value.field == "target"
    monkeypatch.setenv("CHECKBEAT_ALLOW_PRIVATE_TARGETS", "0")
    opened = load_settings(allow_private_targets=True)
    assert validate_check_config(SHARED, "tcp", "127.0.0.1:80", {}, opened) == {}
    only_one = load_settings(allowed_target_addresses="127.0.0.1")
    assert validate_check_config(SHARED, "tcp", "127.0.0.1:80", {}, only_one) == {}
    with pytest.raises(CheckFieldError, match=r"127\.0\.0\.2"):
        validate_check_config(SHARED, "tcp", "127.0.0.2:80", {}, only_one)


def test_two_argument_validators_still_work_and_get_no_settings():
    seen = []

    def two(target, config):
        seen.append((target, config))
        return {"n": 1, **config}

    def three(target, config, settings):
        seen.append(settings.key_prefix)
        return config

    check_kind("two-args", validate=two)(lambda *a: None)
    check_kind("three-args", validate=three)(lambda *a: None)
    try:
        settings = load_settings(key_prefix="from-the-caller")
        assert validate_check_config(SHARED, "two-args", "t", {"x": 2}, settings) == {
            "n": 1,
            "x": 2,
        }
        assert validate_check_config(SHARED, "three-args", "t", {}, settings) == {}
        assert seen == [("t", {"x": 2}), "from-the-caller"]
    finally:
        unregister_kind("two-args")
        unregister_kind("three-args")


# --- config validation ----------------------------------------------------------------------


def test_http_config_is_normalised():
    config = validate_http_config(
        "https://example.com/health", {"method": "head", "expected_status": ["2xx", 304]}
    )
    assert config["method"] == "HEAD"
    assert config["expected_status"] == ["2xx", 304]  # a whole class is kept as its name
    assert config["follow_redirects"] is True


@pytest.mark.parametrize(
    ("target", "config", "field", "message"),
    [
        ("ftp://example.com", {}, "target", "http:// or https://"),
        ("http:///path", {}, "target", "must be a URL with a host"),
        ("http://e.com", {"method": "BREW"}, "config.method", "Input should be 'GET'"),
        ("http://e.com", {"expected_status": [700]}, "config.expected_status", "100..599"),
        ("http://e.com", {"timeout": 3}, "config.timeout", r"unknown field .*\(allowed: "),
        ("http://e.com", {"headers": {"X": 1}}, "config.headers.X", "valid string"),
    ],
)
def test_http_config_errors_name_the_field(target, config, field, message):
    with pytest.raises(CheckFieldError, match=message) as error:
        validate_http_config(target, config)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("target", "config", "field", "message"),
    [
        ("example.com", {}, "target", "must be host:port"),
        ("example.com:70000", {}, "target", "port must be 1..65535"),
        ("a b:80", {}, "target", "must be host:port"),
        ("::1:80", {}, "target", "IPv6 address needs brackets"),
        ("example.com:80", {"port": 80}, "config.port", "unknown field"),
    ],
)
def test_tcp_config_errors_name_the_field(target, config, field, message):
    with pytest.raises(CheckFieldError, match=message) as error:
        validate_tcp_config(target, config)
    assert error.value.field == field


def test_tcp_accepts_bracketed_ipv6():
    assert validate_tcp_config("[2606:4700::1111]:443", {}) == {}


# --- outcomes and their error classes -------------------------------------------------------


def test_http_up_measures_total_time(server):
    result = http_probe(server.url("/delay/120"), {}, ctx())
    assert result.ok and result.status == "up"
    assert 120 <= result.latency_ms < 2000
    assert result.detail["status_code"] == 200
    assert result.detail["address"] == "127.0.0.1"


def test_http_status_and_body_failures_carry_their_class(server):
    status = http_probe(server.url("/status/503"), {}, ctx())
    assert (status.ok, status.error_class, status.detail["status_code"]) == (False, "status", 503)
    expected = http_probe(server.url("/status/503"), {"expected_status": [503]}, ctx())
    assert expected.ok
    body = http_probe(server.url("/body"), {"body_contains": "absent text"}, ctx())
    assert body.error_class == "body"
    found = http_probe(server.url("/body"), {"body_contains": BODY.decode()[6:20]}, ctx())
    assert found.ok


def test_http_timeout_connect_and_dns_failures(server):
    slow = http_probe(server.url("/delay/2000"), {}, ctx(timeout_s=0.3))
    assert (slow.error_class, slow.status) == ("timeout", "timeout")
    assert 250 <= slow.latency_ms < 1500
    refused = http_probe(f"http://127.0.0.1:{closed_port()}/", {}, ctx())
    assert refused.error_class == "connect"
    dns = http_probe("http://does-not-exist.invalid/", {}, ctx())
    assert dns.error_class == "dns"


def test_https_against_a_plain_http_port_is_a_tls_error(server):
    result = http_probe(f"https://127.0.0.1:{server.port}/", {}, ctx())
    assert result.error_class == "tls", result


def test_redirects_are_followed_only_when_asked(server):
    url = server.url(f"/redirect?to={server.url('/body')}")
    assert http_probe(url, {}, ctx()).ok
    held = http_probe(url, {"follow_redirects": False, "expected_status": [200]}, ctx())
    assert (held.error_class, held.detail["status_code"]) == ("status", 302)


def test_tcp_probe_up_and_connect_refused(server):
    up = tcp_probe(f"127.0.0.1:{server.port}", {}, ctx())
    assert up.ok and up.latency_ms < 1000
    down = tcp_probe(f"127.0.0.1:{closed_port()}", {}, ctx())
    assert down.error_class == "connect"
    dns = tcp_probe("does-not-exist.invalid:80", {}, ctx())
    assert dns.error_class == "dns"


def test_a_stored_http_config_is_validated_once_and_a_bad_one_every_time(server):
    from workers.probes.http import _spec

    stored = validate_http_config(server.url("/"), {"expected_status": ["2xx"], "headers": {}})
    first = _spec(stored)
    assert _spec(dict(stored)) is first  # an equal config (another run's copy): the same spec
    assert first.expected_status == tuple(range(200, 300))
    bad = http_probe(server.url("/"), {"expected_status": [700]}, ctx())
    assert (bad.ok, bad.error_class) == (False, "error")
    assert "within 100..599" in (bad.error or "")
    again = http_probe(server.url("/"), {"expected_status": [700]}, ctx())
    assert again.error == bad.error


def test_runs_on_one_thread_share_no_cookies_and_each_opens_its_own_connection():
    """Runs on one thread share nothing: a cookie one check's server set must not reach the
    next run (another tenant's check), and no connection is kept between runs."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str | None, int]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append((self.headers.get("Cookie"), self.client_address[1]))
            body = b"ok"
            self.send_response(200)
            self.send_header("Set-Cookie", "session=secret; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        results = [http_probe(url, {}, ctx()) for _ in range(3)]
    finally:
        server.shutdown()
        server.server_close()
    assert all(r.ok for r in results)
    assert [cookie for cookie, _ in seen] == [None, None, None]
    assert len({port for _, port in seen}) == 3  # a new connection (client port) per run


def test_a_stored_config_past_a_header_bound_fails_its_run_without_quoting_the_value(server):
    """A stored config past the write-time bounds (a header value ending in a newline, as an
    older version or a hand edit may have stored) is refused by the run, naming the header,
    never quoting the token."""
    config = {"headers": {"Authorization": "Bearer s3cret-t0k3n\n"}}
    result = http_probe(server.url("/delay/0"), config, ctx(policy=OPEN))
    assert not result.ok and result.error_class == "error"
    assert "value of 'Authorization' contains a line break" in result.error
    assert "s3cret-t0k3n" not in repr(result)
