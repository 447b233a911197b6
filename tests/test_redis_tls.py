"""checkbeat over TLS for real: Redis servers that listen on TLS only (``port 0``), certificates
from a CA made by the test (trustme), verified by every client checkbeat opens.

* plain Redis over TLS (``rediss://``) as state and broker: a real beat dispatches an http check
  to a real worker, which runs it against a 127.0.0.1 target and completes it, and fires a
  minutely cron task that a real worker runs and records;
* Sentinel with TLS (``sentinel://`` URLs, ``CHECKBEAT_REDIS_SENTINEL_TLS=1``): a master, a
  replica and three Sentinels, every link TLS (``tls-replication yes``); a check runs end to
  end, the master is SIGKILLed, and the same beat and worker run it again on the promoted replica;
* a wrong CA: the error names ``CHECKBEAT_REDIS_TLS_CA_FILE``;
* mutual TLS: ``CHECKBEAT_REDIS_TLS_CERTFILE``/``_KEYFILE`` are presented by state and broker.

Needs a redis-server built with TLS (Debian's, which ``.ci/run`` installs); skipped without one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from faults.fault_procs import Processes, ahead_clock, clocked_env
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.polling import wait_for

from celery_app.checks.store import CheckStore
from celery_app.redis.client import get_redis, reset_clients
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CronStatsField, JobField
from celery_app.settings import load_settings

pytestmark = [pytest.mark.timeout(180)]

#: A simulated minute is 3 real seconds; 20 simulated seconds of grace are 1 real one.
RATE, GRACE_S = 20.0, 20
CRON_TASK = "tlsminute"
CRON_TASKS = f"""
from celery_app import cron


@cron("* * * * *", id={CRON_TASK!r}, name="tlstest.minute")
def minute():
    return None
"""


def _env(tmp_path: Path, state_url: str, broker_url: str, ca: Path, **extra: str) -> dict:
    return clocked_env(
        tmp_path,
        ahead_clock(RATE),
        "tls_tasks",
        CRON_TASKS,
        CHECKBEAT_REDIS_URL=state_url,
        CHECKBEAT_BROKER_URL=broker_url,
        CHECKBEAT_REDIS_TLS_CA_FILE=str(ca),
        CHECKBEAT_CRON_GRACE=str(GRACE_S),
        CHECKBEAT_ALLOWED_TARGET_ADDRESSES="127.0.0.1",
        CHECKBEAT_POOL_SIZE="2",
        CHECKBEAT_FAST_LANE_RESERVED="0",  # one shared worker takes both lanes
        **extra,
    )


def _start(procs: Processes) -> None:
    procs.worker("--role", "shared", "-P", "threads", "-n", "shared@tls")
    procs.worker("-Q", "celery", "-P", "threads", "-c", "1", "-n", "cron@tls")
    procs.beat()


def _plaintext_refused(port: int) -> bool:
    """A plaintext PING gets no answer (the server waits for a TLS handshake)."""
    plain = redis.Redis(port=port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        plain.ping()
    except redis.RedisError:
        return True
    finally:
        plain.close()
    return False


@pytest.mark.slow  # real beat and workers: the long tests run after the default run
def test_state_and_broker_over_rediss_run_a_check_and_fire_cron(
    tmp_path, tls_redis, tls_files, target
):
    import workers.probes  # noqa: F401 - the http kind, in this process too (the store validates)

    assert _plaintext_refused(tls_redis.port)  # TLS or nothing: the clients below speak TLS
    state_url, broker_url = tls_redis.url(1), tls_redis.url(0)
    env = _env(tmp_path, state_url, broker_url, tls_files.ca)
    settings = load_settings(
        redis_url=state_url,
        broker_url=broker_url,
        redis_tls_ca_file=str(tls_files.ca),
        allowed_target_addresses="127.0.0.1",
    )
    keys = state_keys(settings)
    client = get_redis(state_url, settings)
    CheckStore.from_settings(settings).create(
        uid="tls1", tenant="t", kind="http", target=target.url("/named/tls1"), period=2
    )
    procs = Processes(tmp_path, env)
    try:
        _start(procs)
        wait_for(
            lambda: int(client.hget(keys.job("tls1@local"), JobField.RUNS) or 0) >= 2,
            90,
            what="the check to run twice",
        )
        wait_for(
            lambda: int(client.hget(keys.cron_stats(CRON_TASK), CronStatsField.FIRED) or 0) >= 2,
            90,
            what="two cron windows fired",
        )
        wait_for(
            lambda: client.hget(keys.cron_stats(CRON_TASK), CronStatsField.LAST_OUTCOME),
            30,
            what="a cron run recorded by the worker",
        )
        for proc in procs.started:
            assert proc.alive(), proc.output()[-3000:]
    finally:
        procs.stop_all()
    assert target.hits("/named/tls1") >= 2  # the worker probed the target
    assert client.xlen(keys.results("tls1")) >= 2  # and completed each run (complete.lua)
    stats = client.hgetall(keys.cron_stats(CRON_TASK))
    assert stats[CronStatsField.LAST_OUTCOME] == "success", stats


def _sentinel_settings(deployment, ca: Path, **overrides):
    return load_settings(
        redis_url=deployment.url(1),
        broker_url=deployment.url(0),
        redis_sentinel_tls=True,
        redis_tls_ca_file=str(ca),
        allowed_target_addresses="127.0.0.1",
        **overrides,
    )


def _check_runs(client, keys, uid: str) -> int:
    return int(client.hget(keys.job(f"{uid}@local"), JobField.RUNS) or 0)


@pytest.mark.slow
@pytest.mark.parametrize("failover", [False, True])
def test_sentinel_with_tls_runs_a_check_end_to_end_and_follows_a_failover(
    failover, tmp_path, tls_sentinel_deployment, tls_files, target
):
    import workers.probes  # noqa: F401 - the http kind, in this process too (the store validates)

    deployment = tls_sentinel_deployment
    for server in [deployment.master, deployment.replica, *deployment.sentinels]:
        assert _plaintext_refused(server.port), server.port  # every link is TLS
    env = _env(
        tmp_path,
        deployment.url(1),
        deployment.url(0),
        tls_files.ca,
        CHECKBEAT_REDIS_SENTINEL_TLS="1",
    )
    settings = _sentinel_settings(deployment, tls_files.ca)
    keys = state_keys(settings)
    client = get_redis(settings.redis_url, settings)
    CheckStore.from_settings(settings).create(
        uid="stls", tenant="t", kind="http", target=target.url("/named/stls"), period=2
    )
    procs = Processes(tmp_path, env)
    try:
        # prefork for the failover: a threads-pool run acking as every connection drops hits
        # kombu's released-channel race (tests/faults/test_sentinel_failover.py)
        pool = ["-P", "prefork", "-c", "2"] if failover else ["-P", "threads"]
        procs.worker("--role", "shared", *pool, "-n", "shared@stls")
        procs.worker("-Q", "celery", "-P", "threads", "-c", "1", "-n", "cron@stls")
        procs.beat()
        wait_for(lambda: _check_runs(client, keys, "stls") >= 2, 90, what="the check to run twice")
        wait_for(
            lambda: int(client.hget(keys.cron_stats(CRON_TASK), CronStatsField.FIRED) or 0) >= 1,
            90,
            what="a cron window fired",
        )
        with deployment.replica.client(1) as replica:  # replicated over TLS
            wait_for(lambda: replica.exists(keys.job("stls@local")), 10, what="the replica's copy")
        if not failover:  # every WAIT before a protected write counted the TLS replica
            for proc in procs.started:
                assert "replicas within" not in proc.output(), proc.output()[-3000:]
        if failover:
            hits = target.hits("/named/stls")
            old = deployment.master.port
            deployment.master.kill()
            wait_for(
                lambda: deployment.master_port_seen() == deployment.replica.port,
                60,
                what="the Sentinels (over TLS) to promote the replica",
            )
            assert deployment.replica.port != old
            wait_for(
                lambda: target.hits("/named/stls") >= hits + 2,
                90,
                what="the same beat and worker to run the check again on the promoted replica",
            )
            with deployment.replica.client(1) as promoted:
                assert int(promoted.hget(keys.job("stls@local"), JobField.RUNS) or 0) >= 1
        for proc in procs.started:
            assert proc.alive(), proc.output()[-3000:]  # never restarted
    finally:
        procs.stop_all()
    assert client.xlen(keys.results("stls")) >= 2
    assert client.hget(keys.cron_stats(CRON_TASK), CronStatsField.LAST_OUTCOME) == "success"


def test_a_wrong_ca_on_rediss_is_refused_by_state_and_broker_naming_the_setting(
    tmp_path, tls_redis, tls_files
):
    from celery_app.cli.common import redis_unreachable
    from celery_app.factory import create_app

    settings = load_settings(
        redis_url=tls_redis.url(1),
        broker_url=tls_redis.url(0),
        redis_tls_ca_file=str(tls_files.other_ca),
    )
    with pytest.raises(redis.ConnectionError) as failed:
        get_redis(settings.redis_url, settings).ping()
    line = redis_unreachable(failed.value, settings)
    assert f"CHECKBEAT_REDIS_TLS_CA_FILE={tls_files.other_ca}" in line, line
    assert "did not verify" in line and f"127.0.0.1:{tls_redis.port}" in line, line
    # kombu's connection verifies too (alone it would accept any certificate: CERT_NONE)
    from kombu.exceptions import OperationalError

    conn = create_app(settings).connection_for_write()
    with pytest.raises(OperationalError, match="CERTIFICATE_VERIFY_FAILED"), conn:
        conn.ensure_connection(max_retries=0)
    # the command line says the same, in one line, exit code 2
    from support.projects import run_module

    done = run_module(
        "celery", "-A", "celery_app", "checks", "list",
        cwd=tmp_path, pythonpath=[Path(__file__).resolve().parents[1]],
        CHECKBEAT_REDIS_URL=settings.redis_url, CHECKBEAT_BROKER_URL=settings.broker_url,
        CHECKBEAT_REDIS_TLS_CA_FILE=str(tls_files.other_ca),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "CHECKBEAT_REDIS_TLS_CA_FILE" in done.stderr and "Traceback" not in done.stderr
    # and with the right CA the same URL works
    right = load_settings(redis_url=tls_redis.url(1), redis_tls_ca_file=str(tls_files.ca))
    assert get_redis(right.redis_url, right).ping()


def test_a_wrong_ca_under_sentinel_tls_names_the_setting_within_seconds(
    tls_sentinel_deployment, tls_files
):
    from celery_app.cli.common import redis_unreachable

    deployment = tls_sentinel_deployment
    settings = _sentinel_settings(deployment, tls_files.other_ca)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError) as failed:
        get_redis(settings.redis_url, settings).ping()
    # each Sentinel refused at the handshake is skipped at once (it once took 113 s)
    assert time.monotonic() - started < 30
    line = redis_unreachable(failed.value, settings)
    assert f"CHECKBEAT_REDIS_TLS_CA_FILE={tls_files.other_ca}" in line, line
    assert "did not verify" in line, line
    right = _sentinel_settings(deployment, tls_files.ca)
    assert get_redis(right.redis_url, right).ping()


def test_mutual_tls_takes_the_client_certificate_for_state_and_broker(
    tmp_path, tls_redis_binary, tls_files
):
    """A server with ``tls-auth-clients yes``: without CHECKBEAT_REDIS_TLS_CERTFILE/_KEYFILE the
    handshake is refused; with them the state client and kombu's broker connection get in."""
    from kombu.exceptions import OperationalError
    from support.tls_redis import TlsRedisServer

    from celery_app.factory import create_app

    server = TlsRedisServer(tmp_path / "mtls", tls_redis_binary, tls_files, auth_clients=True)
    server.start()
    try:
        common = {"redis_url": server.url(1), "broker_url": server.url(0)}
        anonymous = load_settings(redis_tls_ca_file=str(tls_files.ca), **common)
        with pytest.raises(redis.ConnectionError):
            get_redis(anonymous.redis_url, anonymous).ping()
        conn = create_app(anonymous).connection_for_write()
        with pytest.raises(OperationalError), conn:
            conn.ensure_connection(max_retries=0)
        identified = load_settings(
            redis_tls_ca_file=str(tls_files.ca),
            redis_tls_certfile=str(tls_files.cert),
            redis_tls_keyfile=str(tls_files.key),
            **common,
        )
        client = get_redis(identified.redis_url, identified)
        assert client.set("mtls", "1") and client.get("mtls") == "1"
        with create_app(identified).connection_for_write() as conn:
            conn.ensure_connection(max_retries=0)
            assert conn.default_channel.client.ping()
    finally:
        reset_clients()
        server.stop()
