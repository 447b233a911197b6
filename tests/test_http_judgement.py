"""The http kind's judgement: certificate expiry, latency and body assertions, against real
HTTP(S) servers on 127.0.0.1 (a short-lived certificate from a throwaway CA)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jmespath
import pytest
from support.http_target import DelayServer
from support.recording_server import RecordingServer

from celery_app.checks.run_contract import RunRequest
from celery_app.errors import CheckFieldError
from workers.deadline import Deadline
from workers.outcome import RunOutcome
from workers.probes import ProbeContext, http_probe, validate_http_config
from workers.probes.bounded import json_path_search
from workers.probes.http_judgement import json_equal
from workers.target_guard import AddressPolicy

OPEN = AddressPolicy(allow_private=True)


def ctx(server: RecordingServer | None = None, timeout_s: float = 5.0) -> ProbeContext:
    ca = server.ca_file if server is not None else None
    return ProbeContext(timeout_s=timeout_s, policy=OPEN, tls_ca_file=ca)


def config(target: str, **fields) -> dict:
    """The config as the store keeps it (validated and normalised at write time)."""
    return validate_http_config(target, fields, OPEN)


@pytest.fixture
def short_cert(tmp_path: Path):
    """An https server whose certificate ends in 5 days."""
    not_after = (datetime.now(UTC) + timedelta(days=5)).replace(microsecond=0)
    with RecordingServer(tmp_path, not_after=not_after) as server:
        server.not_after = not_after
        yield server


# --- certificate expiry ------------------------------------------------------------------------


def test_every_https_result_carries_the_certificate_expiry(short_cert):
    url = short_cert.page("/", "ok")
    result = http_probe(url, config(url), ctx(short_cert))
    assert result.ok and result.degraded is None
    assert result.detail["cert_not_after"] == short_cert.not_after.isoformat()
    assert 4.9 < result.detail["cert_days_left"] <= 5.0
    # a failure after the handshake still says when the certificate ends
    missing = short_cert.url("/missing")
    failed = http_probe(missing, config(missing), ctx(short_cert))
    assert not failed.ok and failed.error_class == "status"
    assert failed.detail["cert_not_after"] == short_cert.not_after.isoformat()


def test_tls_min_days_makes_a_success_degraded(short_cert):
    url = short_cert.page("/", "ok")
    result = http_probe(url, config(url, tls_min_days=14), ctx(short_cert))
    assert result.ok and result.status == "up"
    assert result.degraded == "tls_min_days: 4 days left < 14"
    fine = http_probe(url, config(url, tls_min_days=3), ctx(short_cert))
    assert fine.ok and fine.degraded is None


def test_the_degraded_reason_reaches_the_run_record(short_cert):
    url = short_cert.page("/", "ok")
    result = http_probe(url, config(url, tls_min_days=30), ctx(short_cert))
    request = RunRequest("c1@eu", "tok", 1_780_000_000.0, 1_780_000_000.0, 5.0)
    outcome = RunOutcome.of_probe(
        request, result, duration_ms=1.0, started_at=1.0, finished_at=2.0, worker="w", secrets=()
    )
    summary = outcome.summary()  # the task's return value: short, for the log line and Flower
    assert summary == {"job_id": "c1@eu", "status": "up", "latency_ms": outcome.latency_ms,
                       "error_class": None}  # fmt: skip
    record = outcome.record().as_dict()
    assert record["status"] == "up"
    assert record["degraded"].startswith("tls_min_days: 4 days left < 30")
    assert 4.9 < record["detail"]["cert_days_left"] <= 5.0


def test_an_untrusted_certificate_is_a_tls_failure(short_cert):
    url = short_cert.page("/", "ok")
    result = http_probe(url, config(url), ctx(None))  # the test CA is not trusted
    assert not result.ok and result.error_class == "tls"
    assert result.degraded is None


def test_plain_http_results_have_no_certificate(content_server):
    url = content_server.page("/", "ok")
    result = http_probe(url, config(url), ctx())
    assert result.ok and "cert_days_left" not in result.detail


# --- latency -----------------------------------------------------------------------------------


def test_max_latency_ms_makes_a_slow_success_degraded():
    with DelayServer() as server:
        slow = server.url("/delay/300")
        result = http_probe(slow, config(slow, max_latency_ms=100), ctx())
        assert result.ok and result.degraded is not None
        assert result.degraded.startswith("max_latency_ms: ")
        assert result.degraded.endswith(" > 100")
        assert int(result.degraded.split()[1]) >= 300
        fast = server.url("/delay/0")
        assert http_probe(fast, config(fast, max_latency_ms=2000), ctx()).degraded is None


# --- body and JSON assertions -------------------------------------------------------------------


def test_body_regex_match_and_mismatch(content_server):
    url = content_server.page("/", "build 1.24.3 healthy")
    assert http_probe(url, config(url, body_regex=r"build \d+\.\d+\.\d+"), ctx()).ok
    result = http_probe(url, config(url, body_regex=r"^unhealthy"), ctx())
    assert not result.ok and result.error_class == "body" and result.status == "down"
    assert result.error == "body does not match body_regex '^unhealthy'"


def test_body_regex_is_matched_within_the_body_cap(content_server):
    url = content_server.page("/", b"a" * (1 << 20) + b"NEEDLE")
    result = http_probe(url, config(url, body_regex="NEEDLE"), ctx())
    assert not result.ok and "only the first 1 MiB is read" in result.error
    assert http_probe(url, config(url, body_regex="a{250}"), ctx()).ok


def test_json_assertion_passes_and_fails(content_server):
    doc = {"status": "ok", "checks": [{"name": "db", "ok": True}, {"name": "mq", "ok": 1}]}
    url = content_server.page("/health", json.dumps(doc), ctype="application/json")
    assert http_probe(url, config(url, json_path="status", json_expected="ok"), ctx()).ok
    assert http_probe(url, config(url, json_path="checks[0].ok", json_expected=True), ctx()).ok
    assert http_probe(url, config(url, json_path="length(checks)", json_expected=2), ctx()).ok
    wrong = http_probe(url, config(url, json_path="status", json_expected="degraded"), ctx())
    assert not wrong.ok and wrong.error_class == "body"
    assert wrong.error == 'json_path \'status\' is "ok", expected "degraded"'
    # JSON equality, not Python's: 1 is not true
    strict = http_probe(url, config(url, json_path="checks[1].ok", json_expected=True), ctx())
    assert not strict.ok and "is 1, expected true" in strict.error
    absent = http_probe(url, config(url, json_path="nope", json_expected=None), ctx())
    assert absent.ok  # a missing path yields null, which may be what is expected


def test_a_body_that_is_not_json_fails_the_assertion(content_server):
    url = content_server.page("/", "<html>oops</html>")
    result = http_probe(url, config(url, json_path="status", json_expected="ok"), ctx())
    assert not result.ok and result.error_class == "body"
    assert result.error.startswith("body is not JSON, so json_path 'status' cannot be checked")


def test_json_equal_is_json_equality():
    assert json_equal(1, 1.0) and json_equal({"a": [1, "x"]}, {"a": [1.0, "x"]})
    assert not json_equal(True, 1) and not json_equal(0, False) and not json_equal("1", 1)
    assert not json_equal([1], [1, 2]) and not json_equal({"a": 1}, {"b": 1})


# --- validation at write time -------------------------------------------------------------------

HTTPS = "https://example.com/"


@pytest.mark.parametrize(
    ("target", "fields", "field", "allowed"),
    [
        (HTTPS, {"tls_min_days": 0}, "config.tls_min_days", "greater than or equal to 1"),
        (HTTPS, {"tls_min_days": 5000}, "config.tls_min_days", "less than or equal to 3650"),
        ("http://example.com/", {"tls_min_days": 7}, "config.tls_min_days", "https:// targets"),
        (HTTPS, {"max_latency_ms": 0}, "config.max_latency_ms", "greater than or equal to 1"),
        (HTTPS, {"max_latency_ms": "fast"}, "config.max_latency_ms", "valid integer"),
        (HTTPS, {"body_regex": "(unclosed"}, "config.body_regex", "valid RE2 regular"),
        (HTTPS, {"body_regex": "x" * 1025}, "config.body_regex", "at most 1024"),
        (HTTPS, {"body_regex": r"(a)\1"}, "config.body_regex", "no backreferences or lookaround"),
        (HTTPS, {"body_regex": "a(?=b)"}, "config.body_regex", "valid RE2 regular expression"),
        (HTTPS, {"body_regex": "(a|b){1,500}c"}, "config.body_regex", "at most 300 are allowed"),
        (HTTPS, {"body_regex": ""}, "config.body_regex", "non-empty"),
        (HTTPS, {"json_path": "a[", "json_expected": 1}, "config.json_path", "JMESPath"),
        (HTTPS, {"json_path": "a" * 513, "json_expected": 1}, "config.json_path", "at most 512"),
        (HTTPS, {"json_path": "status"}, "config.json_expected", "required with json_path"),
        (HTTPS, {"json_expected": "ok"}, "config.json_path", "required with json_expected"),
        (
            HTTPS,
            {"json_path": "a", "json_expected": "x" * 5000},
            "config.json_expected",
            "at most 4096",
        ),
    ],
)
def test_bad_judgement_fields_are_refused_naming_the_field(target, fields, field, allowed):
    with pytest.raises(CheckFieldError) as caught:
        validate_http_config(target, fields, OPEN)
    assert caught.value.field == field
    assert allowed in str(caught.value)


def test_the_normalised_config_keeps_the_judgement(short_cert):
    url = short_cert.url("/")
    normal = config(url, tls_min_days=14, max_latency_ms=500, body_regex="ok")
    assert normal["tls_min_days"] == 14 and normal["max_latency_ms"] == 500
    assert normal["body_regex"] == "ok" and normal["json_path"] is None
    assert config(url, **normal) == normal  # normalising twice changes nothing


def test_a_custom_kind_may_report_a_degraded_success():
    from workers.runner import normalise

    assert normalise({"ok": True, "degraded": "queue depth 900 > 500"}, 1.0).degraded == (
        "queue depth 900 > 500"
    )
    assert normalise({"ok": True}, 1.0).degraded is None
    failed = normalise({"ok": False, "degraded": "ignored", "error": "no"}, 1.0)
    assert not failed.ok and failed.degraded is None and "degraded" not in failed.detail


# --- the bounded JMESPath interpreter yields what jmespath does ---------------------------------

DOC = {
    "status": "ok",
    "name": "café",
    "n": 3,
    "items": [
        {"id": 1, "ok": True, "tags": ["a", "b"]},
        {"id": 2, "ok": False, "tags": []},
        {"id": 3, "ok": None, "tags": ["a"]},
    ],
    "m": {"x": 1, "y": [1, 2, [3, 4]]},
    "nested": [[1, 2], [3, [4, 5]]],
}
EXPRESSIONS = [
    *("status", "items[*].id", "items[?ok].id", "items[?ok == `false`].id", "items[?id > `1`].id"),
    *("length(items)", "items[0].tags[]", "nested[]", "nested[][]", "m.y[2][1]", "items[-1]"),
    *("items[::2].id", "{a: status, b: n}", "[status, n]", "to_string(m)", "to_string(name)"),
    *("contains(items[*].id, `2`)", "contains(name, 'af')", "join(',', items[0].tags)"),
    *("sort_by(items, &id)[].id", "max_by(items, &id).id", "items[?contains(tags, 'a')].id"),
    *('m == `{"x": 1, "y": [1, 2, [3, 4]]}`', "m != m", "keys(m)", "not_null(missing, n)"),
    *("reverse(items[*].id)", "items[*].tags[]", "`1` == `1.0`", "`true` == `1`", "m.*"),
    *("items[?ok != `null`].id", "merge(m, {z: n})", "avg(items[*].id)", "map(&id, items)"),
    *("items | [0]", "items[*].[id, ok]", "*.x", "status || n", "missing && n", "!status"),
    *('contains(items, `{"id": 2, "ok": false, "tags": []}`)', "items[?tags == `[]`].id"),
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_the_bounded_interpreter_yields_what_jmespath_does(expression):
    found, _steps = json_path_search(expression, DOC, Deadline(5.0))
    assert json.dumps(found, sort_keys=True) == json.dumps(
        jmespath.search(expression, DOC), sort_keys=True
    )
