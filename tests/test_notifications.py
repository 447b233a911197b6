"""Notification targets (docs/notifications.md): the CLI that stores them, and their delivery by
the exactly-once transition path to real receivers on 127.0.0.1: checkbeat's signed JSON
webhook (the receiver verifies the HMAC), a Slack-shaped webhook (Apprise's Mattermost plugin,
whose incoming webhooks take Slack's ``{"text": ...}``: Apprise's ``slack://`` always posts to
hooks.slack.com), Apprise's ``json://`` and an SMTP server (aiosmtpd) for ``mailto://``.

Transitions are made by the post-exec write (support.health.run_once), claimed and published as
the worker that made them does (``claim_and_publish``), and delivered by a real Celery worker
consuming the transition queue: retries go through the broker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from support.health import run_once
from support.polling import wait_for

from celery_app.checks.hooks import on_transition
from celery_app.checks.notify import NotifyStore, read_outcomes, validate_target
from celery_app.checks.transitions import claim_and_publish, pending
from celery_app.factory import settings_of
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import NOTIFY_RECORD_TTL_S

QUEUE = "cbtest.notify"
SECRET = "s3cret-signing-key-0123"


def add_check(cli, uid="web", *extra, ok=True):
    return cli(
        "add", uid, "--tenant", "acme", "--kind", "testprobe", "--target", "x",
        "--period", "30", "--regions", "eu", "--failure-threshold", "1",
        "--success-threshold", "1", *extra, ok=ok,
    )  # fmt: skip


def add_signed_and_json(cli, port: int, scope: tuple[str, str], signed: str, plain: str) -> None:
    """Two targets of ``scope`` (``--check <uid>`` or ``--tenant <name>``) on the receiver at
    ``port``, each named as its path: checkbeat's signed webhook at ``/<signed>`` and Apprise's
    ``json://`` at ``/<plain>``."""
    url = f"checkbeat+webhook://127.0.0.1:{port}/{signed}?secret={SECRET}"
    cli("notify", "add", *scope, "--id", signed, "--url", url)
    cli("notify", "add", *scope, "--id", plain, "--url", f"json://127.0.0.1:{port}/{plain}")


@pytest.fixture
def deliverer(request, make_app, run_worker, test_kind):
    """A worker consuming the transition queue (short backoff: retries 1 s, 2 s, ...; settings
    overridden by an indirect parameter); returns a function that makes one transition of check
    ``uid`` in region eu and publishes it."""
    # the receivers listen on 127.0.0.1: private addresses allowed unless a test says otherwise
    overrides = {
        "transition_timeout": 10,
        "allow_private_targets": True,
        **getattr(request, "param", {}),
    }
    app = make_app(regions=["eu", "us", "ap"], transition_queue=QUEUE, **overrides)
    settings = settings_of(app)
    keys = state_keys(settings)
    run_worker(app, [QUEUE], concurrency=2)

    def transition(r, store, uid: str, ok: bool) -> str:
        part = keys.of_check(uid)  # the worker that made it works in its partition
        _written, made = run_once(r, part, settings, store.params, f"{uid}@eu", ok, time.time())
        assert made is not None
        assert claim_and_publish(app, r, part, settings, time.time(), [made]) == [made]
        return made

    transition.keys = keys
    transition.app = app
    return transition


def verified(received, secret: str) -> dict:
    """The body of a signed webhook request, after checking its signature and timestamp as
    docs/notifications.md tells a receiver to."""
    stamp = received.headers["x-checkbeat-timestamp"]
    expected = hmac.new(secret.encode(), stamp.encode() + b"." + received.body, hashlib.sha256)
    assert hmac.compare_digest(
        received.headers["x-checkbeat-signature"], f"sha256={expected.hexdigest()}"
    )
    assert abs(time.time() - int(stamp)) < 60
    return json.loads(received.body)


def test_each_transition_reaches_every_target_once_signed_slack_shaped_and_email(
    cli, r, store, deliverer, http_receiver, smtp_receiver
):
    add_check(cli)
    port = http_receiver.port
    hook = f"checkbeat+webhook://127.0.0.1:{port}/signed?secret={SECRET}"
    cli("notify", "add", "--tenant", "acme", "--url", hook, "--id", "signed")
    cli("notify", "add", "--check", "web", "--url", f"mmost://127.0.0.1:{port}/slacktoken1234",
        "--id", "slack")  # fmt: skip
    mail = f"mailto://127.0.0.1:{smtp_receiver.port}?from=cb@example.com&to=ops@example.com"
    cli("notify", "add", "--tenant", "acme", "--url", mail, "--id", "mail")
    cli("notify", "add", "--tenant", "other", "--url", f"json://127.0.0.1:{port}/other")

    down = deliverer(r, store, "web", ok=False)
    wait_for(lambda: len(smtp_receiver.messages) == 1, 20, what="the e-mail")
    wait_for(lambda: http_receiver.got("/signed") and http_receiver.got("/hooks/slacktoken1234"),
             20, what="both webhooks")  # fmt: skip
    body = verified(http_receiver.got("/signed")[0], SECRET)
    assert (body["id"], body["uid"], body["tenant"], body["from"], body["to"]) == (
        down, "web", "acme", "up", "down",
    )  # fmt: skip
    assert "web [acme]: up -> down" in body["message"] and "eu: down" in body["message"]
    slack = json.loads(http_receiver.got("/hooks/slacktoken1234")[0].body)
    assert "up -> down" in slack["text"]
    assert smtp_receiver.messages[0]["Subject"] == "[checkbeat] web (acme) is down"
    assert smtp_receiver.messages[0]["To"] == "ops@example.com"

    up = deliverer(r, store, "web", ok=True)
    wait_for(lambda: len(smtp_receiver.messages) == 2, 20, what="the recovery e-mail")
    wait_for(lambda: len(http_receiver.got("/signed")) == 2, 20, what="the recovery webhook")
    wait_for(lambda: pending(r, deliverer.keys) == 0, 20, what="the outbox emptied")
    assert verified(http_receiver.got("/signed")[1], SECRET)["to"] == "up"
    assert len(http_receiver.got("/hooks/slacktoken1234")) == 2
    assert http_receiver.got("/other") == []  # another tenant's target

    rows = json.loads(cli("transitions", "web", "--json"))
    assert [t["id"] for t in rows] == [up, down]
    for row in rows:
        outcomes = {o["scope"] + " " + o["target"].split(":")[0]: o for o in row["notifications"]}
        assert sorted(outcomes) == ["check:web mmost", "tenant:acme checkbeat+webhook",
                                    "tenant:acme mailto"]  # fmt: skip
        assert all(o["ok"] and o["attempts"] == 1 for o in outcomes.values())
    text = cli("transitions", "web")
    assert text.count(" sent at ") == 6
    assert SECRET not in text and "slacktoken1234" not in json.dumps(rows)


@pytest.mark.parametrize("deliverer", [{"allow_private_targets": False}], indirect=True)
def test_a_target_on_a_private_address_is_refused_by_the_worker_and_nothing_is_sent(
    cli, r, store, deliverer, http_receiver, smtp_receiver
):
    """A target is a tenant's URL, as a probe's target is: the worker that delivers resolves
    it under the same guard, by address or by a name resolving to one (``localhost``), for the
    signed webhook and for Apprise's HTTP and SMTP clients alike. Nothing reaches the receivers,
    each refusal is recorded, and the check's hooks still run."""
    port = http_receiver.port
    add_check(cli)
    hooked: list[str] = []
    on_transition(lambda t: hooked.append(t.id), name="count", app=deliverer.app)
    urls = {
        "signed": f"checkbeat+webhook://127.0.0.1:{port}/signed?secret={SECRET}",
        "named": f"json://localhost:{port}/named",
        "mail": f"mailto://127.0.0.1:{smtp_receiver.port}?from=cb@example.com&to=o@example.com",
    }
    for target_id, url in urls.items():
        cli("notify", "add", "--check", "web", "--url", url, "--id", target_id)

    made = deliverer(r, store, "web", ok=False)

    def refused() -> dict:
        outcomes = read_outcomes(r, deliverer.keys, made)
        return outcomes if len(outcomes) == len(urls) else {}

    outcomes = wait_for(refused, 20, what="the three refusals recorded")
    for target_id, outcome in outcomes.items():
        assert not outcome.ok, target_id
        assert "TargetRefused" in outcome.error and "a loopback address" in outcome.error
    assert http_receiver.received == [] and smtp_receiver.messages == []
    wait_for(lambda: made in hooked, 20, what="the check's hooks run all the same")


def test_a_failing_receiver_gets_every_transition_once_it_recovers_and_no_target_twice(
    cli, r, store, deliverer, http_receiver
):
    add_check(cli)
    add_signed_and_json(cli, http_receiver.port, ("--check", "web"), "good", "flaky")
    http_receiver.failing.add("/flaky")
    hooked: list[str] = []
    on_transition(lambda t: hooked.append(t.id), name="count", app=deliverer.app)

    made = [deliverer(r, store, "web", ok=False), deliverer(r, store, "web", ok=True)]
    wait_for(lambda: http_receiver.refused.get("/flaky", 0) >= 4, 30, what="two attempts each")
    keys = deliverer.keys
    for tid in made:
        outcomes = read_outcomes(r, keys, tid)
        assert outcomes["good"].ok and outcomes["good"].attempts == 1
        assert not outcomes["flaky"].ok and "500" in (outcomes["flaky"].error or "")
    failed = cli("transitions", "web")
    assert "FAILED" in failed and "sent at" in failed

    http_receiver.failing.clear()
    wait_for(lambda: pending(r, keys) == 0, 60, what="both transitions delivered")
    flaky = [json.loads(x.body) for x in http_receiver.got("/flaky")]
    assert len(flaky) == 2 and sorted(f["title"] for f in flaky) == [
        "[checkbeat] web (acme) is down", "[checkbeat] web (acme) is up",
    ]  # fmt: skip
    assert sorted(verified(x, SECRET)["id"] for x in http_receiver.got("/good")) == sorted(made)
    for tid in made:
        outcomes = read_outcomes(r, keys, tid)
        assert outcomes["flaky"].ok and outcomes["flaky"].attempts >= 2
        assert outcomes["flaky"].error is None and outcomes["good"].attempts == 1
    assert sorted(hooked) == sorted(made)  # the hook returned the first time: not run again
    assert not any(r.hlen(p.transition_failed()) for p in keys.every_partition())


@pytest.mark.slow
def test_a_receiver_down_for_a_minute_gets_every_transition_once_with_the_default_retries(
    cli, r, store, deliverer, http_receiver
):
    add_check(cli)
    add_signed_and_json(cli, http_receiver.port, ("--tenant", "acme"), "down", "up")
    http_receiver.failing_until["/down"] = time.monotonic() + 60.0
    made = [deliverer(r, store, "web", ok=False), deliverer(r, store, "web", ok=True)]
    keys = deliverer.keys
    wait_for(lambda: len(http_receiver.got("/down")) == 2, 150, 0.5, what="delivered on recovery")
    wait_for(lambda: pending(r, keys) == 0, 20, what="the outbox emptied")
    assert http_receiver.refused["/down"] >= 2 * 6  # 0, 1, 3, 7, 15, 31 s: all inside the minute
    assert sorted(verified(x, SECRET)["id"] for x in http_receiver.got("/down")) == sorted(made)
    assert len(http_receiver.got("/up")) == 2  # the other target: once each, not per retry
    for tid in made:
        outcomes = read_outcomes(r, keys, tid)
        assert outcomes["down"].ok and outcomes["down"].attempts >= 7
        assert outcomes["up"].ok and outcomes["up"].attempts == 1
    assert not any(r.hlen(p.transition_failed()) for p in keys.every_partition())


def test_targets_are_added_listed_masked_and_removed_from_the_command_line(cli, r, keys):
    add_check(cli)
    slack = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/#general"
    out = cli("notify", "add", "--check", "web", "--url", slack, "--id", "s1")
    assert "added target s1 to check:web" in out and "TIiajkdnlazkcOXrIdevi7FQ" not in out
    signed = "checkbeat+webhooks://hooks.example.com/in?secret=abcdefghijklmnopqrstu"
    cli("notify", "add", "--tenant", "acme", "--id", "h1", "--url", signed)
    rows = json.loads(cli("notify", "list", "--json"))
    assert [(t["id"], t["scope"]) for t in rows] == [("s1", "check:web"), ("h1", "tenant:acme")]
    shown = cli("notify", "list") + json.dumps(rows)
    assert "TIiajkdnlazkcOXrIdevi7FQ" not in shown and "abcdefghijklmnopqrstu" not in shown
    assert "secret=***" in shown
    assert [t["id"] for t in json.loads(cli("notify", "list", "--tenant", "acme", "--json"))] == [
        "h1"
    ]
    # the stored URL is the one given (the delivery needs it)
    assert [t.url for t in NotifyStore(r, keys).list("check:web")] == [slack]
    shown = json.loads(cli("show", "web", "--json"))["notify"]  # its own, then its tenant's
    assert [(t["id"], t["scope"]) for t in shown] == [("s1", "check:web"), ("h1", "tenant:acme")]
    text = cli("show", "web")
    assert "notify         slack://T...2/A...D/T...Q/%23general/ (check:web)" in text
    assert "TIiajkdnlazkcOXrIdevi7FQ" not in text + json.dumps(shown)
    cli("notify", "rm", "h1")
    assert "no notification target" in cli("notify", "rm", "h1", ok=False)
    cli("rm", "web")  # a deleted check's targets go with it
    assert cli("notify", "list") == "no notification targets\n"
    assert r.scard(keys.notify_scopes()) == 0


def test_notify_test_sends_a_made_up_transition_now_and_says_why_it_failed(cli, http_receiver):
    add_check(cli)
    port = http_receiver.port
    cli("notify", "add", "--check", "web", "--id", "signed",
        "--url", f"checkbeat+webhook://127.0.0.1:{port}/t?secret={SECRET}")  # fmt: skip
    cli("notify", "add", "--tenant", "acme", "--id", "broken",
        "--url", f"json://user:Canary-Pass-7781@127.0.0.1:{port}/broken")  # fmt: skip
    assert "sent web#test to checkbeat+webhook://127.0.0.1:" in cli("notify", "test", "signed")
    (got,) = http_receiver.got("/t")
    body = verified(got, SECRET)
    assert (body["id"], body["tenant"], body["to"]) == ("web#test", "acme", "down")
    http_receiver.failing.add("/broken")
    out = cli("notify", "test", "broken", ok=False)
    assert cli.exit_code == 1 and "not sent to json://user:***@127.0.0.1" in out
    assert "error=500" in out and "Canary-Pass-7781" not in out
    assert "no notification target" in cli("notify", "test", "nope", ok=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "acme", "--url", "nosuch://x/y"], "url: Apprise cannot use this nosuch://"),
        (["--tenant", "acme", "--url", "slack://"], "url: Apprise cannot use this slack://"),
        (["--tenant", "acme", "--url", "checkbeat+webhook://h.example/x?secret=short"],
         "url: checkbeat+webhook:// needs ?secret= of at least 16"),
        (["--tenant", "acme", "--url", "example.com"], "url: must be a notification URL"),
        (["--tenant", "acme", "--url", "slack://T...2/A...D/T...Q/"], "url: holds '***' or a"),
        (["--tenant", "acme", "--url", "json://u:***@h.example/"], "url: holds '***' or a"),
        (["--tenant", "bad tenant", "--url", "json://h.example/"], "tenant: 'bad tenant'"),
        (["--check", "nope", "--url", "json://h.example/"], "no check"),
        (["--url", "json://h.example/"], "scope:"),
        (["--tenant", "acme", "--url", "json://h.example/", "--id", "a b"], "id: 'a b'"),
    ],
)  # fmt: skip
def test_bad_targets_are_refused_on_one_line_and_nothing_is_written(cli, r, keys, args, message):
    add_check(cli)
    out = cli("notify", "add", *args, ok=False)
    assert message in out and "Traceback" not in out
    assert cli.exit_code == (1 if message == "no check" else 2)
    assert len(out.strip().splitlines()) == 1
    assert r.scard(keys.notify_scopes()) == 0


def test_validate_target_keeps_the_url_and_scopes_it():
    target = validate_target(uid="web", url=" json://h.example/x ", target_id="t")
    assert (target.id, target.scope, target.url) == ("t", "check:web", "json://h.example/x")


def test_targets_as_code_apply_export_masked_and_apply_again_changes_nothing(
    cli, r, keys, tmp_path
):
    import yaml

    slack = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/#general"
    signed = f"checkbeat+webhooks://hooks.example.com/in?secret={SECRET}"
    mail = "mailto://ops:mailpassword@mail.example.com?to=ops@example.com"
    plain = (
        "mailto://127.0.0.1:2525?from=cb@example.com&to=team@example.com"  # shown in its own form
    )
    document = {
        "version": 1,
        "tenants": {"acme": {"notify": [signed, slack]}},
        "checks": [
            {"uid": "web", "tenant": "acme", "kind": "testprobe", "target": "x", "period": 30,
             "regions": ["eu"], "notify": [mail, plain]},
        ],
    }  # fmt: skip
    path = tmp_path / "checks.yaml"
    path.write_text(yaml.safe_dump(document))
    dry = cli("apply", "-f", str(path), "--dry-run")
    assert "4 notification target(s) to add" in dry and SECRET not in dry
    assert "mailpassword" not in dry and "TIiajkdnlazkcOXrIdevi7FQ" not in dry
    assert "4 notification target(s) added" in cli("apply", "-f", str(path))
    stored = {(t.scope, t.url) for t in NotifyStore(r, keys).list()}
    assert stored == {
        ("tenant:acme", signed), ("tenant:acme", slack), ("check:web", mail), ("check:web", plain)
    }  # fmt: skip
    assert "no changes" in cli("apply", "-f", str(path))

    exported = cli("export")
    for secret in (SECRET, "mailpassword", "TIiajkdnlazkcOXrIdevi7FQ"):
        assert secret not in exported
    assert "secret=***" in exported and "mailto://127.0.0.1:2525/team%40example.com" in exported
    masked = tmp_path / "exported.yaml"
    masked.write_text(exported)
    assert "no changes" in cli("apply", "-f", str(masked))  # a mask keeps the stored target
    assert {(t.scope, t.url) for t in NotifyStore(r, keys).list()} == stored
    full = yaml.safe_load(cli("export", "--include-secrets"))
    assert sorted(full["tenants"]["acme"]["notify"]) == sorted([signed, slack])
    assert sorted(full["checks"][0]["notify"]) == sorted([mail, plain])

    # a masked URL nothing stored stands for, and a URL Apprise cannot use: refused, unwritten
    masked_mail = next(t for t in NotifyStore(r, keys).list("check:web") if t.url == mail)
    cli("notify", "rm", masked_mail.id)
    refused = cli("apply", "-f", str(masked), ok=False)
    assert "is masked as `checks export` writes it" in refused and cli.exit_code == 1
    document["tenants"]["acme"]["notify"] = ["nosuch://x", slack]
    path.write_text(yaml.safe_dump(document))
    refused = cli("apply", "-f", str(path), ok=False)
    assert "tenants.acme.notify[0]: Apprise cannot use this nosuch:// URL" in refused
    assert cli.exit_code == 2
    assert len(NotifyStore(r, keys).list()) == 3

    # a notify list the file empties removes the scope's targets (the file's check list adds
    # back the target removed by hand)
    document["tenants"]["acme"]["notify"] = []
    path.write_text(yaml.safe_dump(document))
    assert "1 notification target(s) added, 2 removed" in cli("apply", "-f", str(path))
    assert sorted(t.url for t in NotifyStore(r, keys).list()) == sorted([mail, plain])


@pytest.mark.parametrize("deliverer", [{"transition_retries": 0}], indirect=True)
def test_a_failing_targets_secrets_are_in_no_record_log_or_output(
    cli, r, store, deliverer, http_receiver, caplog
):
    canaries = ("Canary-Pass-7781", "Canary-Header-9912", "Canary-Token-5531")
    add_check(cli)
    port = http_receiver.port
    url = f"json://user:{canaries[0]}@127.0.0.1:{port}/{canaries[2]}/in?+X-Api-Key={canaries[1]}"
    cli("notify", "add", "--check", "web", "--url", url, "--id", "leaky")
    http_receiver.failing.add(f"/{canaries[2]}/in")
    with caplog.at_level("WARNING"):
        made = deliverer(r, store, "web", ok=False)
        keys = deliverer.keys
        failed = keys.of_transition(made).transition_failed()
        wait_for(lambda: r.hexists(failed, made), 20, what="kept as failed")
    outcome = read_outcomes(r, keys, made)["leaky"]
    assert not outcome.ok and outcome.attempts == 1 and outcome.error
    assert 0 < r.ttl(keys.notify_outcomes(made)) <= NOTIFY_RECORD_TTL_S  # the record expires
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "not sent to json://user:***@127.0.0.1" in logged
    shown = [
        logged,
        json.dumps(r.hgetall(failed)),
        json.dumps(r.hgetall(keys.notify_outcomes(made))),
        cli("transitions", "web"),
        cli("transitions", "web", "--json"),
        cli("notify", "list", "--json"),
        cli("export"),
    ]
    for canary in canaries:
        assert all(canary not in text for text in shown), canary
    assert http_receiver.refused[f"/{canaries[2]}/in"] == 1  # sent, refused, not retried
