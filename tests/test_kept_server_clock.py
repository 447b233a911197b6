"""A process keeps Redis's time (``redis.clock.ServerClock``): one ``TIME`` reading advanced by its
monotonic clock, read again after the refresh interval, so neither a check run's start read nor
a tick of beat's dispatcher sends a ``TIME`` of its own, and both are on the server's clock."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from support.polling import wait_for
from support.round_trips import command_name, counting_client
from support.workers import claim_by_hand

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.start_read import read_start
from celery_app.redis.clock import SERVER_CLOCK, ServerClock, server_time


def _times(sends: list[bytes]) -> int:
    return sum(1 for s in sends if command_name(s) == "TIME")


def test_the_kept_clock_reads_time_once_and_follows_the_server(redis_url):
    client, sends = counting_client(redis_url)
    clock = ServerClock(refresh_s=3600)
    before = server_time(client)
    first = clock.now(client)
    after = server_time(client)
    assert before <= first <= after  # its own TIME, between the two
    assert _times(sends) == 3  # the two reads around it and the clock's one reading
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # for a while, with no round trip: still the server's
        sends.clear()
        now = clock.now(client)
        assert _times(sends) == 0
        check = server_time(client)
        assert check - 0.01 <= now <= check + 0.01
        if check - before > 0.2:
            break


def test_the_kept_clock_never_runs_ahead_of_a_server_that_answered_late(redis_url):
    """A TIME held up on its way in (here the server is busy with a 0.3 s command; a new
    connection or a thread off the CPU does the same) is dated when its reply arrives: the
    kept clock is then at or behind the server's, never ahead of it, so a run waiting for its
    tick on it cannot start early."""
    client = redis.Redis.from_url(redis_url)
    blocker = redis.Redis.from_url(redis_url)
    busy = threading.Thread(target=blocker.execute_command, args=("DEBUG", "SLEEP", "0.3"))
    clock = ServerClock(refresh_s=3600)
    client.ping()  # connected: the hold is the server's, not the connection's
    busy.start()
    wait_for(lambda: _server_busy(redis_url), 5, 0.001, what="the server busy in DEBUG SLEEP")
    kept = clock.now(client)  # sent while the server sleeps
    after = server_time(client)
    busy.join()
    assert kept <= after
    for _ in range(20):  # advanced by the monotonic clock, still never ahead
        kept, after = clock.now(client), server_time(client)
        assert kept <= after


def _server_busy(redis_url: str) -> bool:
    """Whether the server leaves a PING unanswered for 50 ms (the connection is then given up)."""
    probe = redis.Redis.from_url(redis_url, socket_timeout=0.05)
    try:
        probe.ping()
        return False
    except redis.TimeoutError:
        return True
    finally:
        probe.close()


def test_the_kept_clock_reads_time_again_after_its_refresh_interval(redis_url):
    client, sends = counting_client(redis_url)
    clock = ServerClock(refresh_s=0.05)
    clock.now(client)
    read_at = time.monotonic()
    assert _times(sends) == 1
    clock.now(client)
    if time.monotonic() - read_at < 0.05:
        assert _times(sends) == 1
    # once the interval has passed, the next call reads the server again
    wait_for(lambda: clock.now(client) and _times(sends) == 2, timeout=5)


def test_a_run_start_read_sends_no_time_and_its_time_is_the_servers(r, keys, store, redis_url):
    store.create(uid="c1", tenant="acme", kind="testprobe", target="x", period=60, regions=["eu"])
    claim_by_hand(r, keys, "c1@eu", "7.1")
    client, sends = counting_client(redis_url)
    SERVER_CLOCK.now(client)  # the process's reading, taken once
    sends.clear()
    before = server_time(r)
    read = read_start(client, keys.of_job("c1@eu"), "c1@eu", "c1", "7.1", "task-1", 60_000)
    after = server_time(r)
    assert read.first_delivery and read.job_hash
    assert _times(sends) == 0
    assert before - 0.01 <= read.server_now <= after + 0.01


@pytest.mark.app_settings(regions=["eu"])
def test_a_beat_tick_on_the_servers_time_sends_no_time(r, keys, app, broker, redis_url):
    """Beat's dispatcher ticks on the kept clock: no ``TIME`` round trip of its own, and its
    time is the server's."""
    client, sends = counting_client(redis_url)
    dispatcher = Dispatcher(app, client=client)
    SERVER_CLOCK.now(client)  # the process's reading, taken once
    sends.clear()
    before = server_time(r)
    report = dispatcher.tick()
    after = server_time(r)
    assert _times(sends) == 0
    assert before - 0.01 <= report.now <= after + 0.01
