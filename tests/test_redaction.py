"""What a check's secrets are and where they are masked (celery_app/checks/redaction.py): the
rules, a run's result built from a probe that quotes a header value, and every CLI command that
shows a check, against a real Redis and a real HTTP server on 127.0.0.1.

The whole path with real beat and worker processes, the broker, hooks, logs and metrics is
tests/faults/test_security.py::test_a_canary_secret_in_every_field_leaves_through_no_channel.
"""

from __future__ import annotations

import json

import pytest
import yaml

from celery_app.checks.definition import decode_config
from celery_app.checks.redaction import (
    MASK,
    check_secrets,
    is_credential_name,
    redact_config,
    redact_target,
    scrub,
)
from celery_app.checks.run_contract import RunRequest
from workers import probes  # noqa: F401 - registers the http kind for the store
from workers.outcome import RunOutcome
from workers.probes.result import ProbeResult

PASSWORD = "pw-Zq81-secret"
QUERY_KEY = "qk-Lm27-secret"
BEARER = "bt-Xy93-secret"
API_KEY = "ak-Hj55-secret"
CUSTOM = "cv-Pp10-secret"
ALL = (PASSWORD, QUERY_KEY, BEARER, API_KEY, CUSTOM)
TARGET = f"http://bob:{PASSWORD}@h.example:9/x?page=2&x_api_key={QUERY_KEY}"
CONFIG = {
    "headers": {
        "Authorization": f"Bearer {BEARER}",
        "X-Api-Key": API_KEY,
        "X-Tenant-Custom": CUSTOM,
        "Accept": "application/json",
    }
}


@pytest.mark.parametrize(
    "name",
    ["token", "TOKEN", "api_key", "apikey", "x_api_key", "X-Api-Key", "key", "secret",
     "client_secret", "password", "passwd", "pwd", "signature", "X-Amz-Signature", "sig",
     "auth", "access_token", "accessToken", "session", "sessionid"],
)  # fmt: skip
def test_credential_names_are_recognised_whole_and_as_suffixes(name):
    assert is_credential_name(name)


@pytest.mark.parametrize("name", ["page", "q", "monkey", "keyword", "tokens_left", "id", ""])
def test_ordinary_names_are_not_credentials(name):
    assert not is_credential_name(name)


def test_a_target_is_shown_without_its_password_or_credential_query_values():
    shown = redact_target(TARGET)
    assert shown == f"http://bob:{MASK}@h.example:9/x?page=2&x_api_key={MASK}"
    assert redact_target("https://tok-only@h.example/") == f"https://{MASK}@h.example/"
    assert redact_target("db.example:5432") == "db.example:5432"  # not a URL: as it is


def test_a_config_is_shown_without_any_header_value_or_credential_named_key():
    config = {**CONFIG, "method": "GET", "auth": {"user": "u", "password": "p4ss"}}
    shown = redact_config(config)
    assert shown["headers"] == dict.fromkeys(CONFIG["headers"], MASK)
    assert shown["auth"] == MASK  # the whole credential-named value
    assert shown["method"] == "GET"


def test_a_text_is_scrubbed_of_every_form_a_secret_is_quoted_in():
    target = "http://bob:p%40ss-word1@h.example/?token=tok+en%2F1"
    config = {"headers": {"Authorization": "Bearer nl-token-77\n", "X-K": "é-key-42"}}
    secrets = check_secrets(target, config)
    texts = [
        "Invalid header value b'Bearer nl-token-77\\n'",  # http.client's bytes repr
        "value 'Bearer nl-token-77\\r\\n' refused",
        "the token nl-token-77 alone",
        '{"h": "\\u00e9-key-42"}',  # JSON-escaped
        "b'\\xe9-key-42'",  # latin-1 bytes repr
        "p@ss-word1 and p%40ss-word1",
        "Basic Ym9iOnBAc3Mtd29yZDE=",  # the probe's basic auth of bob:p@ss-word1
        "tok en/1, tok+en%2F1",
    ]
    for text in texts:
        scrubbed = scrub(text, secrets)
        assert MASK in scrubbed, text
        for secret in ("nl-token-77", "key-42", "ss-word1", "tok en/1", "en%2F1", "Ym9iOnBA"):
            assert secret not in scrubbed, (text, scrubbed)
    assert scrub("nothing of it here", secrets) == "nothing of it here"
    assert check_secrets("http://h.example/", {"headers": {"X-A": "1"}}) == ()  # too short


def test_a_runs_result_is_scrubbed_where_it_is_built():
    """A probe may quote a secret in its error (http.client quotes a header value it refuses; a
    custom kind's library may quote its token): the outcome (the one place a run's result is
    built: what the results stream, the last result and transitions keep) has it masked."""
    config = {"headers": {"Authorization": f"Bearer {BEARER}"}}
    url = f"http://bob:{PASSWORD}@h.example/"
    result = ProbeResult(
        ok=False,
        latency_ms=3.0,
        error_class="error",
        error=f"Invalid header value b'Bearer {BEARER}\\r\\n' for {url}",
    )
    request = RunRequest("c1@eu", "tok", 1_780_000_000.0, 1_780_000_000.0, 5.0)
    outcome = RunOutcome.of_probe(
        request,
        result,
        duration_ms=1.0,
        started_at=1.0,
        finished_at=2.0,
        worker="w",
        secrets=check_secrets(url, config),
    )
    record = json.dumps(outcome.record().as_dict())
    assert "Invalid header value" in record and MASK in record
    assert BEARER not in record and PASSWORD not in record


def test_a_torn_config_is_refused_without_quoting_it():
    """A config hash that is not a JSON object (written by something else) fails the run's
    start read; the error reaches a log line or a quarantine record, so it names no value."""
    with pytest.raises(ValueError) as refused:
        decode_config(json.dumps([f"Bearer {BEARER}"]))
    assert "not a JSON object (a JSON list)" in str(refused.value)
    assert BEARER not in str(refused.value)


def _assert_clean(text: str) -> None:
    for secret in ALL:
        assert secret not in text, (secret, text)


def test_every_command_that_shows_a_check_masks_its_secrets(cli, store, tmp_path):
    added = cli(
        "add", "pw1", "--tenant", "acme", "--kind", "http", "--target", TARGET,
        "--period", "30", "--config", json.dumps(CONFIG),
    )  # fmt: skip
    assert f"added pw1 (http http://bob:{MASK}@h.example:9/x?page=2&x_api_key={MASK})" in added
    shown = [
        added,
        cli("list"),
        cli("list", "--json"),
        cli("show", "pw1"),
        cli("show", "pw1", "--json"),
        cli("transitions", "pw1"),
    ]
    for text in shown:
        _assert_clean(text)
    config = json.loads(cli("show", "pw1", "--json"))["check"]["config"]
    assert config["headers"] == dict.fromkeys(CONFIG["headers"], MASK)
    exported = cli("export")
    _assert_clean(exported)
    entry = yaml.safe_load(exported)["checks"][0]
    assert entry["config"]["headers"]["X-Api-Key"] == MASK
    # the dry run of a changed file shows what changes, not the values
    changed = yaml.safe_load(cli("export", "--include-secrets"))
    assert API_KEY in json.dumps(changed) and PASSWORD in json.dumps(changed)
    changed["checks"][0]["config"]["headers"]["X-Api-Key"] = "ak-new-secret-1"
    changed["checks"][0]["target"] = TARGET.replace(PASSWORD, "pw-new-secret-2")
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    dry = cli("apply", "-f", str(path), "--dry-run")
    assert "~ update pw1: target:" in dry and "config.headers:" in dry
    _assert_clean(dry)
    assert "ak-new-secret-1" not in dry and "pw-new-secret-2" not in dry


def test_a_masked_export_applies_to_its_store_as_no_change(cli, store, tmp_path):
    store.create(uid="pw1", tenant="acme", kind="http", target=TARGET, period=30, config=CONFIG)
    before = store.get("pw1")
    path = tmp_path / "masked.yaml"
    path.write_text(cli("export"))
    assert "no changes (1 check(s) already match)" in cli("apply", "-f", str(path))
    assert store.get("pw1") == before
    # a masked value next to a real change: the change is written, the secrets kept
    document = yaml.safe_load(path.read_text())
    document["checks"][0]["period"] = 60
    document["checks"][0]["config"]["headers"]["X-New"] = "nv-Qq11-secret"
    path.write_text(yaml.safe_dump(document))
    assert "1 updated" in cli("apply", "-f", str(path))
    after = store.get("pw1").definition
    assert after.period == 60 and after.target == TARGET
    assert after.config["headers"] == {**CONFIG["headers"], "X-New": "nv-Qq11-secret"}
    # a mask where the store holds nothing to keep: refused, nothing written
    document["checks"][0]["uid"] = "pw2"
    path.write_text(yaml.safe_dump(document))
    refused = cli("apply", "-f", str(path), ok=False)
    assert "checks[0].target (uid 'pw2'): is '***'" in refused
    assert "checks[0].config.headers.X-Api-Key (uid 'pw2'): is '***'" in refused
    assert store.get("pw2") is None
