"""Hostile probe targets: each run must give its slot back by ``timeout + 0.5 s`` as a timeout.

Real servers on 127.0.0.1 (``hostile_servers``: raw sockets, a thread a connection) that drip
their headers or body a byte every 0.3 s, flood a 300 MB body, stay silent, or never complete a
TCP connect; a name resolving to six such black holes; and the same targets through a real
threads-pool worker, with a custom kind that hangs. Each scenario records a fault-report row:
``runs`` probe runs, ``misses`` = runs that were not a timeout or held the slot past the bound,
``recovery_s`` = the longest slot hold (how long the run kept the worker busy).

The probes refuse loopback by default; every run passes a policy that allows exactly the
test's addresses (the guard stays on for everything else).
"""

from __future__ import annotations

import ipaddress
import json
import random
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from hostile_servers import (
    HUGE_BODY_BYTES,
    HUGE_SNDBUF,
    HostileServer,
    answering,
    black_holes,
    drip_body,
    drip_headers,
    huge_body,
    many_headers,
    patch_resolver,
    read_request,
    silent,
    tls_drip,
)
from support.partitions import suite_keys
from support.polling import wait_for
from support.stall_watch import StallWatch

from celery_app.checks.store import CheckStore
from celery_app.redis.schema import check_queue, job_id
from workers.probes import ProbeContext, ProbeResult, http_probe, tcp_probe, validate_http_config
from workers.probes.bounded import MAX_JSON_DEPTH, MAX_TO_STRING_CHARS
from workers.probes.http import MAX_BODY_BYTES
from workers.target_guard import AddressPolicy

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

GRACE_S = 0.5  # a built-in probe never runs past timeout + this
LOOPBACK = AddressPolicy(allowed=frozenset({ipaddress.ip_address("127.0.0.1")}))
KEYS = suite_keys("cbtest")


def allowing(*addresses: str) -> AddressPolicy:
    return AddressPolicy(allowed=frozenset(ipaddress.ip_address(a) for a in addresses))


def timed(probe, target: str, config: dict, timeout_s: float, policy=LOOPBACK):
    """Run a built-in probe directly: (result, seconds it held the calling thread)."""
    started = time.monotonic()
    result = probe(target, config, ProbeContext(timeout_s=timeout_s, policy=policy))
    return result, time.monotonic() - started


def add_row(
    fault_report, scenario: str, runs: list[tuple[ProbeResult, float]], timeout_s: float, **notes
):
    """Add the scenario's row, then assert every run was a timeout within the bound."""
    bound = timeout_s + GRACE_S
    misses = [(r, held) for r, held in runs if not r.timed_out or held > bound]
    fault_report.add(
        scenario,
        runs=len(runs),
        misses=len(misses),
        max_recovery_s=max(held for _r, held in runs),
        timeout_s=timeout_s,
        slot_hold_s=[round(held, 3) for _r, held in runs],
        **notes,
    )
    assert not misses, f"over {bound} s or not a timeout: {misses}"


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Names resolved from a table in this process (see ``hostile_servers.patch_resolver``)."""
    return patch_resolver(monkeypatch)


# --- one hostile behaviour each -----------------------------------------------------------------


def test_headers_dripped_a_byte_every_300ms_are_cut_off_at_the_deadline(fault_report):
    """Before: each 0.3 s byte met httpx's 2 s read timeout, so the run took ~22 s."""
    with HostileServer(drip_headers) as server:
        result, held = timed(http_probe, server.url("/"), {}, 2.0)
        conn = server.first_connection()
        assert conn.ended.wait(5), "the probe did not hang up"
    assert "ReadTimeout" in result.error
    add_row(
        fault_report,
        "http: headers dripped 1 B / 0.3 s",
        [(result, held)],
        2.0,
        header_bytes_sent=conn.sent,
    )
    assert held >= 2.0 - 0.05


def test_a_body_dripped_after_the_headers_is_cut_off_with_its_status(fault_report):
    with HostileServer(drip_body) as server:
        result, held = timed(http_probe, server.url("/"), {"body_contains": "x"}, 1.5)
    assert result.detail["status_code"] == 200
    assert "body not read within 1.5 s" in result.error
    add_row(fault_report, "http: body dripped 1 B / 0.3 s", [(result, held)], 1.5)


def test_a_huge_body_is_read_to_the_cap_and_the_connection_closed(fault_report):
    """The probe stops at MAX_BODY_BYTES and closes; the server's sends then fail.

    The server's count includes what the kernels buffered on the way (its SO_SNDBUF and the
    probe socket's autotuned receive buffer, up to tcp_rmem's maximum), so the bound asserted
    is MAX_BODY_BYTES + one 64 KiB chunk + those buffers; what matters is that it is not 300 MB.
    """
    rmem_max = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    with HostileServer(huge_body) as server:
        started = time.monotonic()
        result = http_probe(
            server.url("/"), {"body_contains": "needle"}, ProbeContext(10.0, LOOPBACK)
        )
        held = time.monotonic() - started
        conn = server.first_connection()
        assert conn.ended.wait(5), "the server never noticed the probe hung up"
        stopped_after = conn.ended_at - started
    assert (result.error_class, result.detail["status_code"]) == ("body", 200)
    assert held < 2.0, f"reading 1 MiB of loopback took {held:.2f} s"
    assert conn.ended_by in ("ECONNRESET", "EPIPE"), conn.ended_by
    kernel_buffers = 2 * HUGE_SNDBUF + rmem_max  # the kernel may double SO_SNDBUF
    assert conn.sent <= MAX_BODY_BYTES + 65536 + kernel_buffers
    assert conn.sent < HUGE_BODY_BYTES / 10
    fault_report.add(
        "http: 300 MB body, read to the 1 MiB cap",
        runs=1,
        misses=0,
        max_recovery_s=held,
        server_sent_bytes=conn.sent,
        server_stopped_after_s=round(stopped_after, 3),
        cap_bytes=MAX_BODY_BYTES,
    )


def test_a_redirect_with_a_huge_body_is_followed_without_reading_it(fault_report):
    """httpx reads a redirect's body to the end before following it; the probe closes it."""

    def redirect_flood(server, conn, record):
        read_request(conn)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HUGE_SNDBUF)
        head = (
            f"HTTP/1.1 302 Found\r\nLocation: {final.url('/')}\r\n"
            f"Content-Length: {HUGE_BODY_BYTES}\r\n\r\n"
        ).encode()
        conn.sendall(head)
        conn.settimeout(10.0)
        while record.sent < HUGE_BODY_BYTES and not server.stop_event.is_set():
            record.sent += conn.send(b"r" * 65536)

    def ok(server, conn, record):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with HostileServer(ok) as final, HostileServer(redirect_flood) as hop:
        started = time.monotonic()
        result = http_probe(hop.url("/"), {}, ProbeContext(10.0, LOOPBACK))
        held = time.monotonic() - started
        flood = hop.first_connection()
        assert flood.ended.wait(5)
    assert result.ok, result
    assert held < 2.0
    assert flood.sent < 64 * 1024 * 1024  # kernel buffers at most, not 300 MB
    fault_report.add(
        "http: redirect with a 300 MB body",
        runs=1,
        misses=0,
        max_recovery_s=held,
        redirect_bytes_sent=flood.sent,
    )


def test_a_silent_server_and_a_dripped_tls_handshake_time_out(fault_report):
    runs = []
    with HostileServer(silent) as quiet, HostileServer(tls_drip) as tls:
        runs.append(timed(http_probe, quiet.url("/"), {}, 1.0))
        runs.append(timed(http_probe, tls.url("/", scheme="https"), {}, 1.0))
        assert tls.first_connection().sent >= 2  # the handshake really was dripped
    assert "ConnectTimeout" in runs[1][0].error  # a slow handshake is part of connecting
    add_row(fault_report, "http: silent server; TLS handshake dripped", runs, 1.0)


def test_a_name_with_six_black_holed_addresses_shares_one_budget(fault_report, fake_dns):
    """Six loopback listeners whose connects never complete (see ``black_holes``) behind one
    name (``fake_dns``). Before: each address got the full 0.5 s, 3 s in all."""
    runs = []
    with black_holes(6) as (addresses, port):
        fake_dns["six-holes.test"] = addresses
        policy = allowing(*addresses)
        runs.append(timed(http_probe, f"http://six-holes.test:{port}/", {}, 0.5, policy))
        runs.append(timed(tcp_probe, f"six-holes.test:{port}", {}, 0.5, policy))
    for result, _held in runs:
        assert "answered within 0.5 s (tried" in result.error and " of 6)" in result.error
    add_row(fault_report, "http+tcp: name -> 6 black-holed addresses", runs, 0.5)


def test_a_resolver_that_never_answers_is_given_up_at_the_deadline(fault_report, fake_dns):
    """getaddrinfo cannot be interrupted; the probe waits for it in a helper thread only until
    the deadline. The fake resolver blocks until the test ends (then it fails the lookup)."""
    released = threading.Event()

    def hang(host, port):
        released.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "fake resolver released")

    fake_dns["hung-resolver.test"] = hang
    try:
        runs = [
            timed(http_probe, "http://hung-resolver.test/", {}, 0.5),
            timed(tcp_probe, "hung-resolver.test:80", {}, 0.5),
        ]
    finally:
        released.set()
    for result, _held in runs:
        assert "resolving 'hung-resolver.test' did not finish within 0.5 s" in result.error
    add_row(fault_report, "http+tcp: resolver never answers", runs, 0.5)


def test_tcp_connect_that_never_completes_and_a_silent_peer(fault_report):
    """The tcp probe only connects: a peer that accepts and then says nothing is up at once
    (there is no banner to wait for); a connect that never completes is a timeout."""
    with black_holes(1, first=30) as (addresses, port), HostileServer(silent) as quiet:
        hole = timed(tcp_probe, f"{addresses[0]}:{port}", {}, 0.75, allowing(*addresses))
        up, up_held = timed(tcp_probe, quiet.address, {}, 0.75)
    assert up.ok and up_held < 0.5, up
    add_row(fault_report, "tcp: connect never completes", [hole], 0.75)


# --- hostile bodies and rules: bounded by the run's deadline, stalling no other slot -------------

#: The longest another thread of the worker may wait while a run judges a body.
STALL_BOUND_S = 0.1


def judged(url: str, timeout_s: float, **fields) -> tuple[ProbeResult, float, float]:
    """Probe ``url`` with the config as the store keeps it: (result, seconds the slot was held,
    the longest any other thread of this process was stalled meanwhile)."""
    config = validate_http_config(url, fields, LOOPBACK)
    with StallWatch() as watch:
        result, held = timed(http_probe, url, config, timeout_s)
    return result, held, watch.worst_gap_s


def test_a_catastrophic_regex_is_linear_and_stalls_no_other_slot(content_server):
    """Before: ``re`` backtracked 2^26 times on 26 bytes, holding the GIL for 5 s at a 1 s
    timeout, and the run was recorded as a ``body`` failure of 3 ms."""
    url = content_server.page("/", "a" * 26 + "!")
    result, held, stall = judged(url, 1.0, body_regex="^(a+)+$")
    assert (result.error_class, result.error) == (
        "body",
        "body does not match body_regex '^(a+)+$'",
    )
    assert held < 0.5 and stall < STALL_BOUND_S, (held, stall)
    assert judged(content_server.page("/a", "a" * 26), 1.0, body_regex="^(a+)+$")[0].ok


def test_a_costly_regex_gives_its_slot_back_at_the_deadline_as_a_timeout(content_server):
    """RE2 is linear, but its cost per byte grows with the pattern's program: this one on 1 MiB
    takes about a second of CPU, in a thread that releases the GIL and that the run stops
    waiting for at its deadline. Before: ``re`` backtracked without end."""
    rng = random.Random(1)
    url = content_server.page("/", "".join(rng.choice("ab") for _ in range(MAX_BODY_BYTES)))
    result, held, stall = judged(url, 0.3, body_regex="[ab]*a[ab]{250}c")
    assert result.error_class == "timeout", result
    assert "body_regex did not finish within 0.3 s" in result.error
    assert result.latency_ms >= 300  # the run's time, judging included
    assert held < 0.3 + GRACE_S and stall < STALL_BOUND_S, (held, stall)


def test_a_charset_outside_the_safe_list_is_read_as_utf8_within_the_deadline(content_server):
    """Before: ``charset=punycode`` on 1 MiB ran the pure-Python codec for 21 s at 1 s."""
    url = content_server.page("/", b"a" * MAX_BODY_BYTES, ctype="text/plain; charset=punycode")
    result, held, stall = judged(url, 1.0, body_contains="needle")
    assert result.error_class == "body" and "does not contain 'needle'" in result.error
    assert held < 1.0 + GRACE_S and stall < STALL_BOUND_S, (held, stall)
    latin = content_server.page(
        "/latin", "café".encode("latin-1"), ctype="text/plain; charset=ISO-8859-1"
    )
    assert judged(latin, 1.0, body_contains="café")[0].ok
    sjis = content_server.page(
        "/sjis", "健康".encode("shift_jis"), ctype="text/plain; charset=Shift_JIS"
    )
    assert judged(sjis, 1.0, body_contains="健康")[0].ok
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf\x008\r\n"
    with HostileServer(answering(head, b"ok")) as server:  # not a codec name at all
        assert judged(server.url("/"), 1.0, body_contains="ok")[0].ok


def test_a_deeply_nested_json_body_is_a_body_failure_not_an_escaped_exception(content_server):
    """Before: ``json.loads`` raised RecursionError out of the probe (recorded as ``error``)."""
    deep = content_server.page("/deep", "[" * 100_000 + "]" * 100_000, ctype="application/json")
    result, held, stall = judged(deep, 1.0, json_path="status", json_expected="ok")
    assert result.error_class == "body", result
    assert result.error == (
        f"body nests 100000 levels deep; at most {MAX_JSON_DEPTH} are judged, "
        "so json_path 'status' cannot be checked"
    )
    assert held < 1.0 and stall < STALL_BOUND_S, (held, stall)
    over = content_server.page("/65", "[" * 65 + "]" * 65)
    assert "nests 65 levels deep" in judged(over, 1.0, json_path="a", json_expected=1)[0].error
    at_bound = {"status": "ok", "x": json.loads("[" * 63 + "]" * 63), "s": "[[[{{{" * 100}
    ok = content_server.page("/64", json.dumps(at_bound))  # brackets in a string do not count
    assert judged(ok, 1.0, json_path="status", json_expected="ok")[0].ok


DOUBLED_40 = "|".join(["@"] + ["[@,@]"] * 40)  # a list whose expanded size is 2^40


@pytest.mark.parametrize(
    ("path", "error_class", "message"),
    [
        ("|".join(["[@,@][]"] * 25), "body", "json_path would build a list of "),
        (f"({DOUBLED_40}) == ({DOUBLED_40})", "timeout", "json_path did not finish within 1 s"),
        (f"to_string({DOUBLED_40})", "body", f"over {MAX_TO_STRING_CHARS} characters"),
        (DOUBLED_40, "body", f"is {'[' * 41}1], [1]], [[1], [1]]], [[[1], [1]], ..., expected 1"),
        ("abs(@)", "body", "json_path cannot be evaluated: In function abs()"),
    ],
    ids=["flatten-doubling", "equality-of-2^40", "to_string-of-2^40", "shown-2^40", "type"],
)
def test_a_json_path_is_evaluated_within_the_deadline_and_size_caps(
    content_server, path, error_class, message
):
    """Before: each of these ran unbounded holding the GIL (``==`` and ``json.dumps`` recurse
    in C over a value whose parts are shared 2^40 times), or escaped the probe (``abs``)."""
    url = content_server.page("/", "[1]", ctype="application/json")
    result, held, stall = judged(url, 1.0, json_path=path, json_expected=1)
    assert result.error_class == error_class and message in result.error, result
    assert held < 1.0 + GRACE_S and stall < STALL_BOUND_S, (held, stall)


def test_more_than_two_content_codings_are_a_body_failure():
    """Each coding is undone to the body cap: three would be three times its cost."""
    import gzip

    body = gzip.compress(gzip.compress(gzip.compress(b"ok")))
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip, gzip, gzip\r\n"
    with HostileServer(answering(head, body)) as server:
        result, _held, _stall = judged(server.url("/"), 1.0, body_contains="ok")
    assert result.error_class == "body"
    assert "Content-Encoding lists 3 codings; at most 2 are undone" in result.error


def test_a_body_that_decompresses_past_the_cap_is_judged_on_the_cap_and_says_so():
    """A 1 KiB gzip body of 2 MiB: decompressed to 1 MiB only, and a miss says it was cut."""
    import gzip

    body = gzip.compress(b"a" * (2 << 20) + b"needle")
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
    with HostileServer(answering(head, body)) as server:
        result, held, stall = judged(server.url("/"), 1.0, body_regex="needle")
    assert result.error_class == "body" and "(only the first 1 MiB is read)" in result.error
    assert held < 0.5 and stall < STALL_BOUND_S, (held, stall)


def test_a_thousand_response_headers_are_refused_at_once():
    with HostileServer(many_headers) as server:
        result, held, stall = judged(server.url("/"), 1.0)
    assert result.error_class == "connect" and "got more than 100 headers" in result.error
    assert held < 0.5 and stall < STALL_BOUND_S


# --- the same through a real threads-pool worker ------------------------------------------------


@pytest.mark.timeout(90)
def test_hostile_targets_through_a_threads_worker_free_their_slots_in_time(
    r, claim, make_app, run_worker, allow_private, fault_report
):
    """run_check on an in-process ``-P threads`` worker: every slot is back by the run's
    limit + 0.5 s (the result's started/finished times), including a custom kind that hangs
    (its thread is left running and counted by ``stuck_probes``)."""
    import custom_kinds  # noqa: F401 - registers ``sleepy`` in this (the worker's) process

    from workers.runner import stuck_probes

    timeout_s = 1.0
    app = make_app(allow_private_targets=True)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    queues = [check_queue("local", "fast"), check_queue("local", "slow")]
    with (
        HostileServer(drip_headers) as headers,
        HostileServer(drip_body) as body,
        HostileServer(silent) as quiet,
    ):
        checks = {
            "drip-headers": ("http", headers.url("/"), {}),
            "drip-body": ("http", body.url("/"), {}),
            "silent": ("http", quiet.url("/"), {}),
            "hangs": ("sleepy", "anything", {"seconds": 3.0}),
        }
        for uid, (kind, target, config) in checks.items():
            store.create(uid=uid, tenant="t", kind=kind, target=target, config=config, period=60)
        run_worker(app, queues, concurrency=len(checks))
        baseline = stuck_probes()
        for n, uid in enumerate(checks):
            kwargs = {**claim(r, KEYS, job_id(uid, "local"), f"tok-{n}"), "timeout_s": timeout_s}
            app.send_task("checkbeat.run_check", kwargs=kwargs, queue=queues[0])
        wait_for(lambda: all(r.xlen(KEYS.results(uid)) for uid in checks), 20, what="results")
        left_running = stuck_probes() - baseline
        outcomes = {uid: json.loads(r.xrange(KEYS.results(uid))[0][1]["result"]) for uid in checks}
    runs = []
    for _uid, o in outcomes.items():
        held = (
            datetime.fromisoformat(o["finished_at"]) - datetime.fromisoformat(o["started_at"])
        ).total_seconds()
        result = ProbeResult(
            o["status"] == "up",
            o["latency_ms"] or 0.0,
            o["error_class"],
            o["error"],
            o["detail"] or {},
        )
        runs.append((result, held))
    assert outcomes["hangs"]["detail"]["probe_thread"] == "still running"
    assert left_running == 1  # the hanging probe, until its 3 s sleep ends
    wait_for(lambda: stuck_probes() == baseline, 10, what="the abandoned probe to return")
    add_row(
        fault_report,
        "threads worker: 3 hostile http + 1 hanging custom",
        runs,
        timeout_s,
        abandoned_threads=left_running,
    )
