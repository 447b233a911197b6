"""One deadline per probe run: the Deadline object, the guard's resolve/connect sharing it, and
the runner around custom kinds (a helper thread it stops waiting for, and the process-wide count
of such threads still running).

The hostile servers themselves (dripping, flooding, black holes through the built-in probes) are
in tests/faults/test_hostile_targets.py, with their fault-report rows.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import pytest
from hostile_servers import black_holes, patch_resolver
from support.polling import wait_for

from workers import runner
from workers.deadline import HONOURS_DEADLINE_ATTR, Deadline, DeadlineExceeded, honours_deadline
from workers.probes import ProbeContext, ProbeResult, http_probe, tcp_probe
from workers.runner import run_probe, stuck_probes
from workers.target_guard import AddressPolicy, connect_vetted, resolve

GRACE_S = 0.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the Deadline ---------------------------------------------------------------------------


def test_a_deadline_counts_down_and_bounds_each_operation():
    clock = FakeClock()
    deadline = Deadline(2.0, clock=clock)
    assert (deadline.remaining(), deadline.expired) == (2.0, False)
    assert deadline.bound(5.0) == 2.0  # the per-op timeout never outlives the run
    assert deadline.bound(0.5) == 0.5
    assert deadline.bound() == 2.0
    clock.now += 1.5
    assert deadline.remaining() == pytest.approx(0.5)
    assert deadline.bound(5.0) == pytest.approx(0.5)
    assert deadline.elapsed_ms() == pytest.approx(1500.0)
    deadline.check()  # not spent yet
    clock.now += 0.5
    assert (deadline.remaining(), deadline.expired) == (0.0, True)
    with pytest.raises(DeadlineExceeded, match=r"connecting to x did not finish within 2 s"):
        deadline.bound(1.0, what="connecting to x")  # never 0: that would mean non-blocking
    with pytest.raises(TimeoutError):  # callers that catch timeouts catch it
        deadline.check("reading")


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_deadline_needs_a_positive_budget(bad):
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Deadline(bad)


def test_the_context_carries_the_runs_deadline():
    shared = Deadline(3.0)
    context = ProbeContext(timeout_s=3.0, deadline=shared)
    assert context.run_deadline() is shared
    assert ProbeContext(timeout_s=3.0) == context  # the deadline is not part of equality
    fresh = ProbeContext(timeout_s=1.0).run_deadline()
    assert fresh.timeout_s == 1.0 and fresh.remaining() <= 1.0


def test_the_builtin_probes_are_marked_as_honouring_the_deadline():
    assert getattr(http_probe, HONOURS_DEADLINE_ATTR) is True
    assert getattr(tcp_probe, HONOURS_DEADLINE_ATTR) is True


# --- resolve and connect share it -------------------------------------------------------------


def test_resolution_within_a_deadline_answers_like_the_plain_lookup():
    plain = resolve("localhost", 80)
    assert resolve("localhost", 80, Deadline(5.0)) == plain
    assert resolve("127.0.0.7", 80, Deadline(5.0)) == [ipaddress.ip_address("127.0.0.7")]


def test_connect_vetted_gives_all_addresses_one_budget(monkeypatch):
    """Four addresses whose connects never complete (``black_holes``) behind one name: the
    per-connect timeout is 5 s, the run's budget 0.4 s, and the call returns at the budget."""
    names = patch_resolver(monkeypatch)
    with black_holes(4, first=40) as (addresses, port):
        names["four-holes.test"] = addresses
        policy = AddressPolicy(allowed=frozenset(ipaddress.ip_address(a) for a in addresses))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"within 0\.4 s \(tried 1 of 4\)"):
            connect_vetted("four-holes.test", port, 5.0, policy, deadline=Deadline(0.4))
        assert time.monotonic() - started < 0.4 + GRACE_S
        # without a deadline the timeout is the whole call's budget (it was per address)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            connect_vetted("four-holes.test", port, 0.4, policy)
        assert time.monotonic() - started < 0.4 + GRACE_S


def test_connect_vetted_moves_on_after_a_fast_failure_within_the_budget(monkeypatch):
    """First address refuses at once (nothing listens there), the second accepts."""
    names = patch_resolver(monkeypatch)
    with socket.create_server(("127.0.0.51", 0)) as listener:
        port = listener.getsockname()[1]
        names["refused-then-up.test"] = ["127.0.0.50", "127.0.0.51"]
        sock, address = connect_vetted(
            "refused-then-up.test", port, 2.0, AddressPolicy(allow_private=True)
        )
        sock.close()
    assert address == ipaddress.ip_address("127.0.0.51")


# --- the runner around custom kinds -----------------------------------------------------------


def blocking(release: threading.Event, started: threading.Event | None = None):
    """A custom probe (target, config) that blocks until ``release`` is set."""

    def probe(target, config):
        if started is not None:
            started.set()
        release.wait(30)
        return True

    return probe


def test_a_custom_probe_past_its_limit_is_abandoned_at_the_deadline_and_counted():
    release, started = threading.Event(), threading.Event()
    base = stuck_probes()
    try:
        result, elapsed = run_probe(
            blocking(release, started), "t", {}, ProbeContext(0.3), in_thread=True
        )
        assert started.is_set()
        assert (result.ok, result.error_class) == (False, "timeout")
        assert 300 <= elapsed < 300 + GRACE_S * 1000
        assert result.detail == {"probe_thread": "still running", "stuck_probes": base + 1}
        assert "the runner stopped waiting, its thread runs on" in result.error
        assert stuck_probes() == base + 1
    finally:
        release.set()
    wait_for(lambda: stuck_probes() == base, 5, what="the abandoned probe to return")


def test_two_abandoned_probes_count_two_until_each_returns():
    first, second = threading.Event(), threading.Event()
    base = stuck_probes()
    try:
        run_probe(blocking(first), "a", {}, ProbeContext(0.1), in_thread=True)
        run_probe(blocking(second), "b", {}, ProbeContext(0.1), in_thread=True)
        assert stuck_probes() == base + 2
        first.set()
        wait_for(lambda: stuck_probes() == base + 1, 5, what="the first to return")
    finally:
        first.set()
        second.set()
    wait_for(lambda: stuck_probes() == base, 5, what="both to return")


def test_past_the_cap_the_runner_waits_for_the_probe_as_before(monkeypatch):
    """At MAX_STUCK_PROBES the runner holds the slot again: the result comes when the probe
    returns, and is a timeout because it came after the limit."""
    monkeypatch.setattr(runner, "MAX_STUCK_PROBES", stuck_probes())

    def probe(target, config):
        time.sleep(0.5)  # the probe's own duration (work, not synchronisation)
        return True

    result, elapsed = run_probe(probe, "t", {}, ProbeContext(0.2), in_thread=True)
    assert elapsed >= 500
    assert result.error_class == "timeout"
    assert "over its 0.2 s limit" in result.error
    assert "probe_thread" not in result.detail


def raise_(exc: BaseException):
    def probe(target, config):
        raise exc

    return probe


@pytest.mark.parametrize(
    ("probe", "ok", "error_class"),
    [
        (lambda t, c: True, True, None),
        (lambda t, c: None, True, None),
        (lambda t, c: False, False, "error"),
        (lambda t, c: {"ok": False, "error_class": "status"}, False, "status"),
        (lambda t, c: ProbeResult.down("body", "no", 1.0), False, "body"),
        (lambda t, c: "nonsense", False, "error"),
        (raise_(ValueError("boom")), False, "error"),
        (raise_(TimeoutError("slow")), False, "timeout"),
    ],
)
def test_a_custom_probe_in_a_thread_is_folded_exactly_as_inline(probe, ok, error_class):
    for in_thread in (False, True):
        result, _ = run_probe(probe, "t", {}, ProbeContext(2.0), in_thread=in_thread)
        assert (result.ok, result.error_class) == (ok, error_class), in_thread


def test_the_runner_passes_its_deadline_down_to_the_probe():
    seen = {}

    def probe(target, config, context):
        seen["deadline"] = context.deadline
        return {"ok": True, "left_s": context.deadline.remaining()}

    result, _ = run_probe(probe, "t", {}, ProbeContext(2.0), in_thread=True)
    assert isinstance(seen["deadline"], Deadline) and seen["deadline"].timeout_s == 2.0
    assert 0 < result.detail["left_s"] <= 2.0


def test_by_default_only_custom_probes_on_a_pool_thread_run_in_a_helper_thread():
    """Main thread (prefork/solo: the soft limit's signal lands there): inline. A worker thread
    (the threads pool): a custom probe gets a helper thread, a marked (built-in) one does not."""
    ran_in: list[threading.Thread] = []

    def custom(target, config):
        ran_in.append(threading.current_thread())
        return True

    @honours_deadline
    def bounded(target, config, context):
        ran_in.append(threading.current_thread())
        return True

    run_probe(custom, "t", {}, ProbeContext(2.0))
    assert ran_in[-1] is threading.main_thread()

    def on_a_pool_thread(probe) -> threading.Thread:
        caller = threading.Thread(target=run_probe, args=(probe, "t", {}, ProbeContext(2.0)))
        caller.start()
        caller.join(5)
        return caller

    on_a_pool_thread(custom)
    assert ran_in[-1].name == "checkbeat-probe"
    caller = on_a_pool_thread(bounded)
    assert ran_in[-1] is caller
