"""Names users choose: one tenant rule and one id rule for cron and checks, matched whole, and
no control or format characters in names, targets or anything printed on a terminal."""

from __future__ import annotations

import json

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner
from support.state_db import snapshot

from celery_app.cli.checks import checks
from celery_app.cli.schedule import schedule
from celery_app.cli.tenants import tenants
from celery_app.cli.terminal import escape
from celery_app.cron_tasks.registration import CronSpecError, cron
from celery_app.cron_tasks.tenants_provider import TenantError, validate_tenant
from celery_app.errors import CheckFieldError
from celery_app.factory import settings_of
from celery_app.names import is_id, is_tenant
from celery_app.redis.schema import Keys

#: Characters that must never reach a key or a terminal raw: ESC (terminal escapes), NUL, a
#: newline (``$`` matched before it), a right-to-left override, a zero width space, and the
#: Unicode line separator.
HOSTILE = ["\x1b", "\x00", "\n", "\u202e", "\u200b", "\u2028"]


def _noop() -> None: ...


def invoke(group, app, *args: str):
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    return CliRunner().invoke(group, list(args), obj=obj, catch_exceptions=False)


# --- the rules themselves ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["acme", "acme@corp.com", "a", "A-1_b.c", "x" * 128])
def test_one_tenant_rule_accepts_the_same_names_for_cron_and_checks(store, name):
    assert is_tenant(name)
    assert validate_tenant(name) == name
    defn = store.create(uid="c1", tenant=name, kind="testprobe", target="x", period=60)
    assert defn.tenant == name


@pytest.mark.parametrize(
    "name",
    ["acme\n", "acme ", "-acme", "@acme", "a:b", "a|b", "a b", "", "x" * 129, "ac\u00e9me"]
    + [f"ac{c}me" for c in HOSTILE],
)
def test_one_tenant_rule_refuses_the_same_names_for_cron_and_checks(store, r, name):
    assert not is_tenant(name)
    with pytest.raises(TenantError, match="is not allowed"):
        validate_tenant(name)
    with pytest.raises(CheckFieldError) as caught:
        store.create(uid="c1", tenant=name, kind="testprobe", target="x", period=60)
    assert caught.value.field == "tenant"
    assert "letters, digits" in str(caught.value)
    assert r.dbsize() == 0


@pytest.mark.parametrize(
    "uid", ["web\n", "web ", "a@b", "a:b", "a/b", "", "x" * 201] + [f"w{c}b" for c in HOSTILE]
)
def test_one_id_rule_for_check_uids_and_cron_ids(store, r, cron_app, uid):
    assert not is_id(uid)
    with pytest.raises(CheckFieldError) as caught:
        store.create(uid=uid, tenant="acme", kind="testprobe", target="x", period=60)
    assert caught.value.field == "uid" and "letters, digits" in str(caught.value)
    if uid:  # an empty cron id means "the function's name"
        with pytest.raises(CronSpecError, match="may contain only"):
            cron("* * * * *", app=cron_app, id=uid, name="tests.names.bad")(_noop)
    assert r.dbsize() == 0


def test_an_id_may_use_the_whole_id_alphabet(store, cron_app):
    uid = "Web-1_eu.v2"
    assert store.create(uid=uid, tenant="acme", kind="testprobe", target="x", period=60)
    cron("* * * * *", app=cron_app, id=uid, name="tests.names.ok")(_noop)


@pytest.mark.parametrize("char", HOSTILE)
def test_targets_refuse_control_and_format_characters(store, r, char):
    store.create(uid="keep", tenant="acme", kind="testprobe", target="x", period=60)
    before = snapshot(r)
    for write in (
        lambda: store.create(uid="c1", tenant="acme", kind="testprobe", target=f"a{char}b",
                             period=60),
        lambda: store.update("keep", target=f"a{char}b"),
    ):  # fmt: skip
        with pytest.raises(CheckFieldError) as caught:
            write()
        assert caught.value.field == "target"
        assert ascii(char)[1:-1] in str(caught.value)
        assert "control and format characters are not allowed" in str(caught.value)
    assert snapshot(r) == before


def test_targets_keep_other_unicode_and_are_bounded(store, r):
    assert store.create(uid="c1", tenant="acme", kind="testprobe", target="https://bücher.de/",
                        period=60).target == "https://bücher.de/"  # fmt: skip
    with pytest.raises(CheckFieldError, match="at most 2048"):
        store.create(uid="c2", tenant="acme", kind="testprobe", target="x" * 2049, period=60)


def test_tenants_cli_refuses_a_trailing_newline_and_writes_nothing(dispatcher_app, r, keys):
    result = invoke(tenants, dispatcher_app, "add", "globex", "acme\n")
    assert result.exit_code != 0
    assert "'acme\\n' is not allowed" in result.output
    assert r.exists(keys.tenants()) == 0


# --- terminal escaping ---------------------------------------------------------------------


def test_escape_keeps_text_and_escapes_what_a_terminal_would_obey():
    assert escape("bücher.de/ok") == "bücher.de/ok"
    assert escape("a\x1b]0;pwned\x07b") == "a\\x1b]0;pwned\\x07b"
    assert escape("evil\u202etxt.exe\u200b\u2028") == "evil\\u202etxt.exe\\u200b\\u2028"
    assert escape(None) == "None"


def _raw_check(r, keys, uid: str, tenant: str, target: str) -> None:
    """A check as stored before the rules existed (written around the validation)."""
    r.hset(
        keys.check(uid),
        mapping={"t": tenant, "k": "testprobe", "tg": target, "cf": '{"note":"\\u001b[2J"}',
                 "p": "60", "g": "eu", "w": "0", "e": "1", "v": "1"},
    )  # fmt: skip
    r.sadd(keys.checks(), uid)


def test_checks_list_and_show_escape_stored_user_text(dispatcher_app, r, keys, test_kind):
    _raw_check(r, keys, "old\x1b[31m", "acme\x1b]0;x\x07", "http://x/\u202eexe")
    listed = invoke(checks, dispatcher_app, "list")
    assert listed.exit_code == 0, listed.output
    assert "\x1b" not in listed.output and "\u202e" not in listed.output
    assert "old\\x1b[31m" in listed.output and "acme\\x1b]0;x\\x07" in listed.output
    assert "\\u202eexe" in listed.output
    shown = invoke(checks, dispatcher_app, "show", "old\x1b[31m")
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\u202e" not in shown.output
    assert "\\x1b[2J" in shown.output  # the config value, too
    as_json = json.loads(invoke(checks, dispatcher_app, "list", "--json").output)
    assert as_json[0]["tenant"] == "acme\x1b]0;x\x07"  # JSON keeps the data, escaped by json


def test_tenants_list_escapes_stored_names(dispatcher_app, r, keys):
    r.sadd(keys.tenants(), "acme", "evil\x1b[2J")
    result = invoke(tenants, dispatcher_app, "list")
    assert result.exit_code == 0
    assert result.output.split() == ["acme", "evil\\x1b[2J"]


def test_schedule_list_escapes_error_text(cron_app, r):
    cron("* * * * *", app=cron_app, id="report", name="tests.names.report")(_noop)
    keys = Keys(settings_of(cron_app).key_prefix)
    r.hset(
        keys.cron_stats("report"),
        mapping={"last_outcome": "failure", "last_error": "boom\x1b]0;pwned\x07 \u202eok"},
    )
    result = invoke(schedule, cron_app, "list")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "failure: boom\\x1b]0;pwned\\x07 \\u202eok" in result.output
