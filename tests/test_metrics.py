"""The metrics pieces against a real Redis: the per-check exporter's pages and cap, the
scrape-time gauges, the dispatch counters the hooks move, the health rules, the endpoint list,
the HTTP server's answers and the settings' errors."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest
import redis
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from support.checks import learned, register_fake_worker
from support.partitions import pinned
from support.polling import wait_for

from beat.cron_engine import Fired, Skipped, TickReport
from beat.metrics_endpoint import BeatHealth, checks_page
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.metrics_exporter import CheckExporter
from celery_app.checks.metrics_state import CheckStateCollector
from celery_app.checks.quarantine import quarantine
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.local import lateness
from celery_app.metrics import endpoints, record
from celery_app.metrics.server import (
    Credentials,
    MetricsServer,
    PageError,
    health_page,
    metrics_page,
)
from celery_app.redis.schema import (
    CronSkipReason,
    QuarantineStep,
    job_id,
)
from celery_app.settings import SettingsError, load_settings


def samples(families) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in families:
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


PROMOTED = "checkbeat_dispatch_promoted_total"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def write_result(r, keys, uid: str, region: str, status: RunStatus, **detail) -> None:
    record_ = RunRecord(
        status=status, region=region, finished_at=1_790_000_000.0, latency_ms=42.0, detail=detail
    )
    r.hset(keys.last_result(uid), region, record_.to_json())


# --- the per-check exporter -------------------------------------------------------------------
def test_exporter_pages_are_capped_sorted_and_say_how_many_there_are(r, keys, store, test_kind):
    for i in range(25):
        store.create(
            uid=f"c{i:02d}",
            tenant=f"t{i % 3}",
            kind=test_kind,
            target="x",
            period=60,
            regions=["eu", "us"],
        )
    # as the http probe records it (workers/probes/http_judgement.py): ISO 8601
    expires = datetime.fromtimestamp(1_800_000_000, UTC).isoformat()
    write_result(r, keys, "c00", "eu", RunStatus.UP, cert_not_after=expires)
    write_result(r, keys, "c00", "us", RunStatus.DOWN)
    exporter = CheckExporter(r, keys, page_size=10)

    first = samples(exporter.page(0))
    assert first["checkbeat_probe_exporter_checks_stored", ()] == 25
    assert first["checkbeat_probe_exporter_pages", ()] == 3
    assert first["checkbeat_probe_exporter_page_checks", ()] == 10
    on_page = {dict(k[1])["check"] for k in first if k[0] == "checkbeat_probe_cost_ewma_seconds"}
    assert on_page == {f"c{i:02d}" for i in range(10)}  # the first ten in uid order, no more
    eu = (("check", "c00"), ("region", "eu"), ("tenant", "t0"))
    us = (("check", "c00"), ("region", "us"), ("tenant", "t0"))
    assert first["checkbeat_probe_success", eu] == 1
    assert first["checkbeat_probe_success", us] == 0
    assert first["checkbeat_probe_duration_seconds", eu] == pytest.approx(0.042)
    assert first["checkbeat_probe_ssl_earliest_cert_expiry", eu] == 1_800_000_000
    assert ("checkbeat_probe_ssl_earliest_cert_expiry", us) not in first  # unknown: absent
    assert first["checkbeat_probe_lane", (eu[0], ("lane", "fast"), *eu[1:])] == 1
    # A check without a result has its cost and lane, no success series.
    c01 = (("check", "c01"), ("region", "eu"), ("tenant", "t1"))
    assert ("checkbeat_probe_success", c01) not in first
    assert ("checkbeat_probe_cost_ewma_seconds", c01) in first

    last = samples(exporter.page(2))
    assert last["checkbeat_probe_exporter_page_checks", ()] == 5
    beyond = samples(exporter.page(3))
    assert beyond["checkbeat_probe_exporter_page_checks", ()] == 0
    # A new check is on its page at the next scrape (the count changed: the uids are read again).
    store.create(uid="c00a", tenant="t0", kind=test_kind, target="x", period=60, regions=["eu"])
    again = samples(exporter.page(0))
    assert again["checkbeat_probe_exporter_checks_stored", ()] == 26
    new = (("check", "c00a"), ("region", "eu"), ("tenant", "t0"))
    assert ("checkbeat_probe_cost_ewma_seconds", new) in again


def test_the_checks_page_refuses_a_bad_page_number(r, keys):
    page = checks_page(CheckExporter(r, keys, page_size=10))
    for bad in ("x", "-1", "1.5", "10000000"):
        with pytest.raises(PageError, match="page must be an integer from 0 to 1000000"):
            page({"page": bad})
    assert page({}).status == 200


# --- the scrape-time gauges and the dispatch counters ----------------------------------------
def test_state_gauges_and_dispatch_counters_follow_a_real_claim(
    r, keys, store, test_kind, settings, dispatcher_app, broker
):
    # in the first partition of the check half, the one the dispatcher below claims from
    uids = [pinned(keys, f"s{i}") for i in range(3)]
    for i, uid in enumerate(uids):
        store.create(uid=uid, tenant="t", kind=test_kind, target="x", period=60, regions=["eu"])
        # measured fast checks (a never-measured one would take a shared slot, as slow)
        learned(r, keys, store.params, job_id(uid, "eu"), scheduled_at=1_999_999_990.0 + i)
    register_fake_worker(r, keys, "w-eu", region="eu", role="shared", concurrency=2, ttl=None)
    before = {
        name: value(name, region="eu", lane="fast")
        for name in ("checkbeat_dispatch_claimed_total", "checkbeat_dispatch_published_total")
    }
    promoted_before = value(PROMOTED, region="eu", lane="fast")
    dispatcher = Dispatcher(dispatcher_app, client=r)
    report = dispatcher.tick(now=2_000_000_000.0)
    assert len(report.claims) == 2 and report.published == 2

    promoted = value(PROMOTED, region="eu", lane="fast") - promoted_before
    assert promoted == 3
    for name in before:
        assert value(name, region="eu", lane="fast") - before[name] == 2
    collector = CheckStateCollector(r, broker, keys, settings.regions)
    got = samples(collector.collect())
    eu_fast = (("lane", "fast"), ("region", "eu"))
    assert got["checkbeat_redis_up", ()] == 1 and got["checkbeat_broker_up", ()] == 1
    assert got["checkbeat_checks_stored", ()] == 3
    assert got["checkbeat_checks_ready", eu_fast] == 1
    assert got["checkbeat_checks_leased", eu_fast] == 2
    assert got["checkbeat_region_free_slots", eu_fast] == 0
    assert got["checkbeat_broker_queue_messages", eu_fast] == 2
    assert got["checkbeat_region_workers", (("region", "eu"),)] == 1
    assert got["checkbeat_region_workers", (("region", "us"),)] == 0
    assert got["checkbeat_region_slots", (("region", "eu"),)] == 2

    # The claims are given back (a failed publish): counted as released.
    released = value("checkbeat_dispatch_released_total", region="eu", lane="fast")
    dispatcher.release(report.claims)
    assert value("checkbeat_dispatch_released_total", region="eu", lane="fast") - released == 2

    # A job set aside is counted (and leaves the ready index it was in).
    assert samples(collector.collect())["checkbeat_checks_quarantined", ()] == 0
    assert quarantine(r, keys, job_id(uids[0], "eu"), QuarantineStep.CLAIM, "torn", 2_000_000_000.0)
    got = samples(collector.collect())
    assert got["checkbeat_checks_quarantined", ()] == 1
    assert got["checkbeat_checks_ready", eu_fast] == 2


def test_an_unreachable_redis_reports_down_and_no_stale_numbers(keys, settings):
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    got = samples(CheckStateCollector(dead, dead, keys, settings.regions).collect())
    assert got == {("checkbeat_redis_up", ()): 0, ("checkbeat_broker_up", ()): 0}


# --- the cron hooks --------------------------------------------------------------------------
def test_cron_tick_counts_fired_skipped_and_missed_per_task():
    from datetime import UTC, datetime

    w = datetime(2026, 1, 1, tzinfo=UTC)
    names = ("checkbeat_cron_windows_fired_total", "checkbeat_cron_windows_missed_total")
    before = [value(n, task="hook-task") for n in names]
    skipped_before = value("checkbeat_cron_windows_skipped_total", task="hook-task", reason="taken")
    report = TickReport(
        w,
        fired=(Fired("hook-task", "-", w), Fired("hook-task", "a", w)),
        skipped=(
            Skipped("hook-task", "-", w, CronSkipReason.TAKEN),
            Skipped("hook-task", "*", w, CronSkipReason.MISSED),
        ),
    )
    record.cron_tick(report)
    assert value(names[0], task="hook-task") - before[0] == 2
    assert value(names[1], task="hook-task") - before[1] == 1
    assert (
        value("checkbeat_cron_windows_skipped_total", task="hook-task", reason="taken")
        - skipped_before
        == 1
    )


# --- health ------------------------------------------------------------------------------------
def test_beat_is_healthy_only_within_twice_its_interval():
    health = BeatHealth()
    assert health.check(now=100.0) == (False, {"reason": "no tick yet"})
    health.ticked(3.0, now=100.0)
    assert health.check(now=105.9)[0] is True
    ok, detail = health.check(now=106.1)
    assert ok is False and detail["limit_s"] == 6.0 and "twice its interval" in detail["reason"]
    health.ticked(0.01, now=200.0)  # a short sleep still allows MIN_INTERVAL_S
    assert health.check(now=201.9)[0] is True and health.check(now=202.1)[0] is False


# --- the server and the endpoint list ---------------------------------------------------------
def test_server_answers_metrics_health_404_400_and_lists_itself(r, keys):
    healthy = {"ok": True}

    def bad(_query):
        raise PageError("page must be an integer, got 'x'")

    server = MetricsServer(
        "127.0.0.1:0",
        {
            "/metrics": metrics_page(REGISTRY),
            "/healthz": health_page(lambda: (healthy["ok"], {"why": "test"})),
            "/bad": bad,
        },
        name="test@proc",
        role="test",
        client=r,
        keys=keys,
    ).start()
    try:
        base = server.url

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as reply:
                    return reply.status, reply.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        status, body = get("/metrics")
        assert status == 200
        names = {f.name for f in text_string_to_metric_families(body)}
        assert "checkbeat_beat_tick_duration_seconds" in names
        assert get("/healthz") == (200, json.dumps({"ok": True, "why": "test"}))
        healthy["ok"] = False
        assert get("/healthz")[0] == 503
        assert get("/nowhere")[0] == 404
        assert get("/bad") == (400, "page must be an integer, got 'x'\n")
        listed = endpoints.endpoints(r, keys)
        assert [(e["name"], e["url"], e["role"]) for e in listed] == [("test@proc", base, "test")]
        # An entry nobody refreshed for a minute is a dead process's: not listed.
        assert endpoints.endpoints(r, keys, now=listed[0]["at"] + endpoints.STALE_S + 1) == []
    finally:
        server.stop()
    assert endpoints.endpoints(r, keys) == []  # a stopped server removes its entry


# --- settings ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        ("metrics_addr", "9808", "must be host:port with a port from 0 to 65535"),
        ("metrics_addr", "127.0.0.1:70000", "must be host:port with a port from 0 to 65535"),
        ("metrics_addr", "a b:80", "is not a host name or IP address"),
        ("metrics_checks_page_size", "0", ">= 1 and <= 100,000"),
        ("metrics_checks_page_size", "100001", ">= 1 and <= 100,000"),
    ],
)
def test_bad_metrics_settings_name_the_variable_and_the_range(monkeypatch, name, given, message):
    monkeypatch.setenv(f"CHECKBEAT_{name.upper()}", given)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"CHECKBEAT_{name.upper()}" in str(err.value) and message in str(err.value)


def test_metrics_are_off_unless_an_address_is_set():
    assert load_settings().metrics_addr == ""
    assert load_settings(metrics_addr=" [::1]:0 ").metrics_addr == "[::1]:0"
    assert job_id("a", "eu") == "a@eu"  # the exporter's job ids are the schema's


# --- the live view's lateness -----------------------------------------------------------------
def test_lateness_quantiles_interpolate_inside_buckets_like_histogram_quantile():
    from celery_app.local.lateness import difference, quantile, summary

    inf = float("inf")
    buckets = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)  # rank 50 ends the first bucket
    assert quantile(0.7, buckets) == pytest.approx(0.1 + 0.4 * (70 - 50) / 40)
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (99 - 90) / 10)
    assert quantile(0.99, {0.1: 1.0, inf: 2.0}) == 0.1  # in +Inf: the highest finite bound
    assert quantile(0.5, {0.1: 0.0, inf: 0.0}) is None
    window = difference(
        {("eu", "fast"): {0.1: 60.0, inf: 60.0}}, {("eu", "fast"): {0.1: 50.0, inf: 50.0}}
    )
    assert summary(window) == {"eu/fast": {"p50": 0.05, "p99": pytest.approx(0.099), "runs": 10}}


def test_a_taken_address_is_logged_and_the_process_goes_on(caplog):
    from celery_app.metrics.server import start_or_log

    first = MetricsServer("127.0.0.1:0", {}, name="first", role="test").start()
    try:
        second = MetricsServer(f"127.0.0.1:{first.port}", {}, name="second", role="test")
        assert start_or_log(second) is None
        assert f"second cannot listen on 127.0.0.1:{first.port}" in caplog.text
    finally:
        first.stop()


def test_the_view_shows_lateness_per_lane_and_the_endpoints():
    from rich.console import Console

    from celery_app.local.view import render

    data = {
        "lanes": [
            {"region": "eu", "lane": "fast", "running": 1, "queued": 0, "waiting": 2},
            {"region": "eu", "lane": "slow", "running": 0, "queued": 0, "waiting": 0},
        ],
        "checks": [],
        "cron": [],
        "lateness": {"eu/fast": {"p50": 0.012, "p99": 0.25, "runs": 40}},
        "metrics": [
            {
                "name": "beat@h:1",
                "role": "beat",
                "metrics": "http://127.0.0.1:9/metrics",
                "healthz": "http://127.0.0.1:9/healthz",
            }
        ],
    }
    console = Console(width=200, record=True)
    console.print(render(data))
    text = console.export_text()
    assert "0.01 / 0.25" in text  # eu/fast p50 / p99
    assert "- / -" in text  # eu/slow: no runs yet
    assert "http://127.0.0.1:9/metrics" in text and "beat@h:1" in text


def test_with_the_refresher_a_new_check_is_on_its_page_a_scrape_later(r, keys, store, test_kind):
    from support.polling import wait_for

    store.create(uid="a", tenant="t", kind=test_kind, target="x", period=60, regions=["eu"])
    exporter = CheckExporter(r, keys, page_size=10, cache_s=3600).start_refresh()
    try:
        assert samples(exporter.page(0))["checkbeat_probe_exporter_page_checks", ()] == 1
        store.create(uid="b", tenant="t", kind=test_kind, target="x", period=60, regions=["eu"])
        # This scrape sees the count change and wakes the refresher; a later one has "b".
        wait_for(
            lambda: samples(exporter.page(0))["checkbeat_probe_exporter_page_checks", ()] == 2,
            10,
            what="the refreshed uid list",
        )
    finally:
        exporter.stop_refresh()


# --- credentials: a real scrape of a real beat and worker ---------------------------------------

BASIC = "prom:s3cret-pw"
BEARER = "t0k3n-for-scrapes"


def scrape(url: str, authorization: str | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()
    except OSError:  # not listening yet
        return 0, {}, ""


@pytest.mark.timeout(120)
def test_beat_and_worker_pages_need_credentials_when_they_are_set(tmp_path, r):
    """401 (with a challenge) without credentials or with wrong ones, 200 with the bearer token
    or the basic pair, on /metrics, /metrics/checks and /healthz alike; no secret logged."""
    from support.processes import Processes

    from celery_app.local.embedded_redis import free_port

    ports = {"beat": free_port(), "worker": free_port()}
    credentials = {
        "CHECKBEAT_METRICS_BASIC_AUTH": BASIC,
        "CHECKBEAT_METRICS_BEARER_TOKEN": BEARER,
    }
    procs = Processes(tmp_path)
    try:
        procs.celery(
            "beat", "beat", "-l", "INFO", **credentials,
            CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['beat']}",
        )  # fmt: skip
        procs.celery(
            "worker", "worker", "--role", "shared", "-P", "threads", "-n", "auth@metrics",
            "--without-mingle", "--without-gossip", "-l", "INFO", **credentials,
            CHECKBEAT_METRICS_ADDR=f"127.0.0.1:{ports['worker']}",
        )  # fmt: skip
        basic = "Basic " + base64.b64encode(BASIC.encode()).decode()
        bearer = f"Bearer {BEARER}"
        for name, port in ports.items():
            healthz = f"http://127.0.0.1:{port}/healthz"
            wait_for(
                lambda url=healthz: scrape(url, bearer)[0] == 200, 60, what=f"{name}'s /healthz"
            )
            paths = ["/metrics", "/healthz"] + (["/metrics/checks"] if name == "beat" else [])
            for path in paths:
                url = f"http://127.0.0.1:{port}{path}"
                status, headers, body = scrape(url)
                assert status == 401, (name, path, status)
                assert headers["WWW-Authenticate"] == 'Basic realm="checkbeat"'
                assert "checkbeat_" not in body
                for wrong in (
                    "Bearer nope",
                    "Basic " + base64.b64encode(b"prom:nope").decode(),
                    "Basic !!!",
                    f"Token {BEARER}",
                ):
                    assert scrape(url, wrong)[0] == 401, (name, path, wrong)
                for right in (bearer, basic):
                    status, _headers, body = scrape(url, right)
                    assert status == 200, (name, path, right, body[:200])
            assert "checkbeat_" in scrape(f"http://127.0.0.1:{port}/metrics", basic)[2]
        # checkbeat status / up read the workers' lateness histograms with the same credentials
        worker_metrics = [f"http://127.0.0.1:{ports['worker']}/metrics"]
        sent = Credentials.of(load_settings(**{"metrics_bearer_token": BEARER}))
        assert lateness.scrape(worker_metrics) == {}  # refused: nothing read
        assert lateness.scrape(worker_metrics, authorization=sent.authorization()) != {}
    finally:
        procs.stop()
    for name in ports:
        log = procs.output(name)
        assert "(credentials required)" in log, log[-2000:]
        assert "s3cret-pw" not in log and BEARER not in log
