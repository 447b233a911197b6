"""A run's end that could not be written because Redis was away is written once it is back, so
the in-flight key it releases does not hold the task's later windows until its TTL. Real
redis-servers, killed and started again on the same port."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from support.polling import wait_for

from celery_app.cron_tasks.cron_state import CronStore
from celery_app.cron_tasks.late_records import FIRST_PAUSE_S, LateRecords
from celery_app.cron_tasks.registration import GLOBAL_TENANT, window_id
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.schema import CronOutcome, CronStateField, Keys

KEYS = Keys("cblate")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = window_id(T0)
LATER = window_id(T0 + timedelta(minutes=1))


@pytest.fixture
def server(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def _store(server: RedisServer) -> tuple[redis.Redis, CronStore]:
    client = redis.Redis.from_url(server.url(), socket_timeout=2, socket_connect_timeout=1)
    return client, CronStore(client, KEYS, timedelta(seconds=60))


def test_an_end_written_while_redis_is_away_is_written_when_it_is_back(server):
    client, store = _store(server)
    client.set(KEYS.cron_inflight("nightly", GLOBAL_TENANT), WINDOW, px=600_000)
    records = LateRecords()
    ended_at = T0 + timedelta(seconds=30)

    server.kill()
    written = records.write_or_keep(
        "the end of nightly",
        lambda: store.run_finished(
            "nightly", GLOBAL_TENANT, WINDOW, CronOutcome.SUCCESS, "", ended_at
        ),
    )
    assert not written
    assert records.pending() == 1
    server.start()

    wait_for(lambda: records.pending() == 0, 30, what="the kept end to be written")
    assert client.get(KEYS.cron_inflight("nightly", GLOBAL_TENANT)) is None
    state = client.hgetall(KEYS.cron_state("nightly", GLOBAL_TENANT))
    assert state[CronStateField.OUTCOME.encode()] == CronOutcome.SUCCESS.encode()
    # the run's own end time, not the time Redis came back
    assert float(state[CronStateField.LAST_END.encode()]) == ended_at.timestamp()


def test_a_late_end_does_not_release_a_later_runs_key(server):
    client, store = _store(server)
    records = LateRecords()
    server.kill()
    records.write_or_keep(
        "the end of nightly",
        lambda: store.run_finished(
            "nightly", GLOBAL_TENANT, WINDOW, CronOutcome.FAILURE, "boom", datetime.now(UTC)
        ),
    )
    server.start()
    client.set(KEYS.cron_inflight("nightly", GLOBAL_TENANT), LATER, px=600_000)

    wait_for(lambda: records.pending() == 0, 30, what="the kept end to be written")
    assert client.get(KEYS.cron_inflight("nightly", GLOBAL_TENANT)) == LATER.encode()


def test_while_redis_stays_away_the_retries_back_off():
    """No retry loop spins on a refused connection: the pauses between attempts grow from
    FIRST_PAUSE_S, also after a record was written and the next one fails."""
    attempts: list[float] = []
    records = LateRecords()

    def written_on_the_second_try() -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 2:
            raise redis.ConnectionError("refused")

    def refused() -> None:
        attempts.append(time.monotonic())
        raise redis.ConnectionError("refused")

    assert not records.write_or_keep("first", written_on_the_second_try)
    wait_for(lambda: records.pending() == 0, 10, what="the first record written")
    assert not records.write_or_keep("second", refused)
    wait_for(lambda: len(attempts) >= 6, 10, what="three retries of the second record")
    # attempts: the first record's write, its retry; the second's write, then its retries
    assert attempts[1] - attempts[0] >= FIRST_PAUSE_S
    assert attempts[3] - attempts[2] >= FIRST_PAUSE_S
    assert attempts[4] - attempts[3] >= 2 * FIRST_PAUSE_S
    assert attempts[5] - attempts[4] >= 4 * FIRST_PAUSE_S


def test_an_error_other_than_redis_being_away_is_raised_not_kept():
    records = LateRecords()

    def broken() -> None:
        raise ValueError("not a Redis outage")

    with pytest.raises(ValueError):
        records.write_or_keep("a broken record", broken)
    assert records.pending() == 0
