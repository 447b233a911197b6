"""``checks apply -f`` / ``checks export``: checks as code against a real Redis."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from celery_app.checks.maintenance import MaintenanceStore, validate_window
from celery_app.checks.manifest import MAX_FILE_BYTES, ManifestError, load_manifest
from celery_app.checks.ratelimit import get_rate_limit, set_rate_limit


def check(i: int, tenant: str = "acme", **extra) -> dict:
    return {
        "uid": f"web{i}",
        "tenant": tenant,
        "kind": "http",
        "target": f"https://svc-{i}.example.com/health",
        "period": 60,
        "regions": ["eu", "us"],
        **extra,
    }


def write(tmp_path: Path, document: dict, name: str = "checks.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def state(r, keys) -> dict:
    """Every check hash and job hash with its content: what an apply may have changed."""
    return {
        key: r.hgetall(key) for key in sorted(r.keys(f"{keys.prefix}*")) if r.type(key) == "hash"
    }


BASE = {
    "version": 1,
    "tenants": {"acme": {"rate_limit": {"per_minute": 120, "burst": 30}}},
    "checks": [check(1, config={"max_latency_ms": 500}), check(2), check(3, tenant="beta")],
}


def test_dry_run_prints_the_diff_and_writes_nothing(cli, r, tmp_path):
    path = write(tmp_path, BASE)
    out = cli("apply", "-f", path, "--dry-run")
    assert "+ create web1 (acme: http https://svc-1.example.com/health every 60s in eu,us)" in out
    assert "+ create web3 (beta:" in out
    assert "+ rate limit acme: none -> 120/min burst 30" in out
    assert "dry run: 3 to create, 0 to update, 0 to delete, 1 rate limit change(s)" in out
    assert r.dbsize() == 0


def test_apply_then_the_same_file_again_changes_nothing(cli, r, keys, store, tmp_path):
    path = write(tmp_path, BASE)
    assert "applied: 3 created, 0 updated, 0 deleted, 1 rate limit(s) changed" in cli(
        "apply", "-f", path
    )
    assert [d.uid for d in store.list()] == ["web1", "web2", "web3"]
    assert store.get("web1").definition.config["max_latency_ms"] == 500
    assert len(store.jobs("web1")) == 2
    bucket = get_rate_limit(r, keys, "acme")
    assert (bucket.per_minute, bucket.burst) == (120.0, 30.0)
    before = state(r, keys)
    assert len(before) == 3 + 6 + keys.partitions  # checks, jobs, the bucket in each partition
    assert "no changes (3 check(s) already match)" in cli("apply", "-f", path)
    out = cli("apply", "-f", path, "--dry-run", "--prune")
    assert (
        "0 to create, 0 to update, 0 to delete, 0 rate limit change(s), 0 window(s) to add, "
        "0 to remove, 0 notification target(s) to add, 0 to remove, 3 unchanged" in out
    )
    assert state(r, keys) == before  # not even a version bump


def test_update_prints_each_changed_field_and_keeps_the_jobs_learning(cli, store, tmp_path):
    cli("apply", "-f", write(tmp_path, BASE))
    changed = {
        **BASE,
        "checks": [
            check(1, config={"max_latency_ms": 800}),
            check(2, period=30),
            BASE["checks"][2],
        ],
    }
    path = write(tmp_path, changed)
    out = cli("apply", "-f", path, "--dry-run")
    assert "~ update web1: config.max_latency_ms: 500 -> 800" in out
    assert "~ update web2: period: 60 -> 30" in out
    assert "1 unchanged" in out
    assert "applied: 0 created, 2 updated, 0 deleted" in cli("apply", "-f", path)
    assert store.get("web1").definition.config["max_latency_ms"] == 800
    assert store.get("web2").definition.period == 30 and store.get("web2").version == 2
    assert store.get("web3").version == 1
    assert "no changes" in cli("apply", "-f", path)


def test_prune_deletes_only_the_files_tenants_checks(cli, r, keys, store, tmp_path):
    cli("apply", "-f", write(tmp_path, BASE))
    store.create(uid="other1", tenant="gamma", kind="http", target="https://g.example/", period=60)
    smaller = {"version": 1, "checks": [check(1, config={"max_latency_ms": 500})]}
    path = write(tmp_path, smaller)
    assert "no changes" in cli("apply", "-f", path)  # without --prune nothing is deleted
    out = cli("apply", "-f", path, "--prune", "--dry-run")
    assert "- delete web2 (acme:" in out
    assert "web3" not in out and "other1" not in out  # beta and gamma are not in the file
    cli("apply", "-f", path, "--prune")
    assert sorted(d.uid for d in store.list()) == ["other1", "web1", "web3"]
    assert r.exists(keys.job("web2@eu")) == 0
    # a tenant named in the tenants section is in scope even with no checks: all of it goes,
    # and a tenants entry without rate_limit clears the bucket under --prune
    empty_beta = {"version": 1, "tenants": {"beta": {}, "acme": {}}}
    out = cli("apply", "-f", write(tmp_path, empty_beta), "--prune")
    assert "2 deleted, 1 rate limit(s) changed" in out
    assert [d.uid for d in store.list()] == ["other1"]
    assert get_rate_limit(r, keys, "acme") is None


def test_a_bad_check_among_many_is_refused_with_line_index_and_field(cli, r, tmp_path):
    items = [check(i) for i in range(60)]
    items[37] = check(37, config={"body_regex": "(unclosed"})
    items[52] = check(52, period=0)
    document = {"version": 1, "tenants": {"acme": {"rate_limit": {"per_minute": 5}}}}
    path = write(tmp_path, {**document, "checks": items})
    text = Path(path).read_text().splitlines()
    regex_line = next(n for n, line in enumerate(text, 1) if "(unclosed" in line)
    period_line = next(n for n, line in enumerate(text, 1) if "period: 0" in line)
    out = cli("apply", "-f", path, ok=False)
    assert "checks.yaml: 2 problem(s), nothing written" in out
    assert (
        f"checks.yaml:{regex_line}: checks[37].config.body_regex (uid 'web37'): "
        "is not a valid RE2 regular expression" in out
    )
    assert (
        f"checks.yaml:{period_line}: checks[52].period (uid 'web52'): must be an integer >= 1"
        in out
    )
    assert len(out.splitlines()) == 3  # the head line, then one line a problem
    assert r.dbsize() == 0  # not the 58 good checks, not the rate limit


def test_every_section_is_validated_with_its_place(tmp_path, settings):
    text = """\
version: 1
colour: blue
tenants:
  acme:
    rate_limit: {per_minute: -1}
    maintenance:
      - {cron: "0 3 * * SUN", duration: 2h, timezone: Europe/Paris}
      - {cron: "61 * * * *", duration: 1h}
      - {cron: "0 3 * * *", duration: 40d}
      - {cron: "0 4 * * *", duration: 1h, timezone: Mars/Olympus}
  "bad tenant!": {}
checks:
  - {uid: a, tenant: acme, kind: http, target: "https://a.example/", period: 60}
  - {uid: a, tenant: acme, kind: http, target: "https://b.example/", period: 60}
  - {uid: c, tenant: acme, kind: nope, target: x, period: 60}
  - just a string
"""
    import workers.probes  # noqa: F401 - the http kind

    with pytest.raises(ManifestError) as caught:
        load_manifest(text, settings, source="f.yaml")
    shown = str(caught.value)
    assert "f.yaml:2: colour: unknown key (allowed: version, tenants, checks)" in shown
    assert "f.yaml:5: tenants.acme.rate_limit.per_minute: must be a number > 0" in shown
    assert "f.yaml:8: tenants.acme.maintenance[1].cron: minute field: bad token '61'" in shown
    assert (
        "f.yaml:9: tenants.acme.maintenance[2].duration: must be whole seconds >= 60 and "
        "<= 604,800 (7 days) or a text such as '90m', '2h', '1h30m', '1d', got '40d'" in shown
    )
    assert "f.yaml:10: tenants.acme.maintenance[3].timezone: unknown timezone" in shown
    assert "f.yaml:11: tenants.bad tenant!: 'bad tenant!' is not a tenant name" in shown
    assert "f.yaml:14: checks[1].uid (uid 'a'): duplicate uid (also checks[0])" in shown
    assert "f.yaml:15: checks[2].kind (uid 'c'): unknown kind 'nope'" in shown
    assert "f.yaml:16: checks[3]: must be a mapping" in shown
    assert len(caught.value.problems) == 9


def windows(r, keys) -> set[tuple[str, str, int, str]]:
    """The stored windows by identity (scope, cron, seconds, timezone)."""
    return {(w.scope, w.cron, w.duration_s, w.timezone) for w in MaintenanceStore(r, keys).list()}


WINDOWS = {
    "version": 1,
    "tenants": {"acme": {"maintenance": [{"cron": "0 2 * * SUN", "duration": "1h30m"}]}},
    "checks": [
        check(1, maintenance=[{"cron": "@daily", "duration": 600, "timezone": "Asia/Tokyo"}]),
        check(2),
    ],
}


def test_maintenance_windows_are_stored_and_a_second_apply_changes_nothing(
    cli, r, keys, settings, tmp_path
):
    path = write(tmp_path, WINDOWS)
    out = cli("apply", "-f", path, "--dry-run")
    assert f"+ window tenant:acme: '0 2 * * SUN' for 5400s in {settings.timezone}" in out
    assert "+ window check:web1: '@daily' for 600s in Asia/Tokyo" in out
    assert "2 window(s) to add, 0 to remove" in out
    assert r.dbsize() == 0
    assert "applied: 2 created, 0 updated, 0 deleted, 0 rate limit(s) changed, 2 window(s) " in (
        cli("apply", "-f", path)
    )
    assert windows(r, keys) == {
        ("tenant:acme", "0 2 * * SUN", 5400, settings.timezone),
        ("check:web1", "@daily", 600, "Asia/Tokyo"),
    }
    before, version = state(r, keys), r.get(keys.maintenance_version())
    assert "no changes (2 check(s) already match)" in cli("apply", "-f", path)
    assert "0 window(s) to add, 0 to remove" in cli("apply", "-f", path, "--prune", "--dry-run")
    assert state(r, keys) == before and r.get(keys.maintenance_version()) == version
    # the worker's view: the check's window and its tenant's
    assert len(MaintenanceStore(r, keys).for_check("web1", "acme")) == 2


def test_a_scope_with_a_maintenance_key_is_made_to_match_the_others_only_under_prune(
    cli, r, keys, store, settings, tmp_path
):
    cli("apply", "-f", write(tmp_path, WINDOWS))
    # windows added by hand: one on a check the file lists without a maintenance key, one on
    # a tenant the file does not name
    store.create(uid="other1", tenant="gamma", kind="http", target="https://g.example/", period=60)
    cli("maintenance", "add", "--check", "web2", "--cron", "0 5 * * *", "--duration", "60",
        "--timezone", "UTC", "--id", "byhand")  # fmt: skip
    cli("maintenance", "add", "--tenant", "gamma", "--cron", "0 6 * * *", "--duration", "60",
        "--timezone", "UTC", "--id", "gamma1")  # fmt: skip
    changed = {
        **WINDOWS,
        "tenants": {"acme": {"maintenance": [{"cron": "0 2 * * SUN", "duration": "2h"}]}},
        "checks": [check(1, maintenance=[]), check(2)],
    }
    path = write(tmp_path, changed)
    out = cli("apply", "-f", path, "--dry-run")
    assert f"- window tenant:acme: '0 2 * * SUN' for 5400s in {settings.timezone} (id " in out
    assert f"+ window tenant:acme: '0 2 * * SUN' for 7200s in {settings.timezone}" in out
    assert "- window check:web1: '@daily' for 600s in Asia/Tokyo" in out
    assert "byhand" not in out and "gamma" not in out  # no maintenance key for web2 / gamma
    assert "1 window(s) added, 2 removed" in cli("apply", "-f", path)
    assert windows(r, keys) == {
        ("tenant:acme", "0 2 * * SUN", 7200, settings.timezone),
        ("check:web2", "0 5 * * *", 60, "UTC"),
        ("tenant:gamma", "0 6 * * *", 60, "UTC"),
    }
    assert not r.sismember(keys.maintenance_scopes(), "check:web1")  # emptied scope forgotten
    assert "no changes" in cli("apply", "-f", path)
    # --prune: web2 is a check of the file, so its hand-made window goes; gamma is not named
    out = cli("apply", "-f", path, "--prune", "--dry-run")
    assert "- window check:web2: '0 5 * * *' for 60s in UTC (id byhand)" in out
    assert "gamma" not in out
    cli("apply", "-f", path, "--prune")
    assert {w[0] for w in windows(r, keys)} == {"tenant:acme", "tenant:gamma"}
    # the same window stored twice (by hand) in a scope the file lists: one is kept
    cli("maintenance", "add", "--tenant", "acme", "--cron", "0 2 * * SUN", "--duration", "7200")
    assert len(MaintenanceStore(r, keys).list("tenant:acme")) == 2
    assert "0 window(s) added, 1 removed" in cli("apply", "-f", path)
    assert len(MaintenanceStore(r, keys).list("tenant:acme")) == 1
    # a pruned check loses its windows with it
    cli("maintenance", "add", "--check", "web2", "--cron", "0 5 * * *", "--duration", "60")
    out = cli("apply", "-f", write(tmp_path, {**changed, "checks": [check(1)]}), "--prune")
    assert "1 deleted" in out and "1 removed" in out
    assert {w[0] for w in windows(r, keys)} == {"tenant:acme", "tenant:gamma"}


def test_a_bad_window_among_good_ones_is_refused_with_line_and_field(cli, r, tmp_path):
    good = {"cron": "0 3 * * *", "duration": "1h", "timezone": "Europe/Paris"}
    items = [check(i, maintenance=[good]) for i in range(30)]
    items[17] = check(17, maintenance=[good, {"cron": "0 4 * * *", "duration": 10}])
    items[23] = check(23, maintenance=[good, dict(good)])
    document = {"version": 1, "tenants": {"acme": {"maintenance": [good]}}, "checks": items}
    path = write(tmp_path, document)
    text = Path(path).read_text().splitlines()
    bad_line = next(n for n, line in enumerate(text, 1) if "duration: 10" in line)
    out = cli("apply", "-f", path, ok=False)
    assert "checks.yaml: 2 problem(s), nothing written" in out
    assert (
        f"checks.yaml:{bad_line}: checks[17].maintenance[1].duration: must be whole seconds "
        ">= 60 and <= 604,800 (7 days)" in out
    )
    assert "checks[23].maintenance[1]: duplicate window (also checks[23].maintenance[0])" in out
    assert r.dbsize() == 0  # neither the 28 good checks nor any window


def test_a_yaml_syntax_error_names_its_line(cli, r, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("version: 1\nchecks:\n  - uid: a\n   tenant: [unclosed\n")
    out = cli("apply", "-f", str(path), ok=False)
    assert "broken.yaml:4: not valid YAML" in out
    assert r.dbsize() == 0


def test_export_then_apply_changes_nothing(cli, r, keys, store, tmp_path):
    # a store built by hand, not from a file: CLI adds, a disabled check, a rate limit
    store.create(
        uid="h1",
        tenant="acme",
        kind="http",
        target="https://user:pw@h1.example/x",
        period=45,
        regions=["eu", "us", "ap"],
        region_spread=5.5,
        plan_weight=3,
        config={"expected_status": "2xx", "json_path": "ok", "json_expected": True},
    )
    store.create(uid="t1", tenant="beta", kind="tcp", target="db.example:5432", period=10)
    store.create(uid="p1", tenant="beta", kind="testprobe", target="x", period=30)
    store.set_enabled("t1", False)
    set_rate_limit(r, keys, "beta", per_minute=0.5, burst=1)
    m = MaintenanceStore(r, keys)
    m.add(validate_window(uid="h1", cron="0 3 * * sun", duration=7200, timezone="Europe/Berlin"))
    m.add(validate_window(uid="h1", cron="@daily", duration="60", timezone="UTC"))
    m.add(validate_window(tenant="beta", cron="30 1 1 * *", duration=600, timezone="UTC"))
    m.add(validate_window(tenant="delta", cron="0 0 * * *", duration=60, timezone="Asia/Tokyo"))
    exported = cli("export")
    document = yaml.safe_load(exported)
    h1 = next(c for c in document["checks"] if c["uid"] == "h1")
    assert h1["config"] == {
        "expected_status": ["2xx"],
        "json_path": "ok",
        "json_expected": True,
    }  # the defaults are left out
    assert h1["maintenance"] == [
        {"cron": "0 3 * * sun", "duration": 7200, "timezone": "Europe/Berlin"},
        {"cron": "@daily", "duration": 60, "timezone": "UTC"},
    ]
    assert document["tenants"] == {
        "beta": {
            "rate_limit": {"per_minute": 0.5, "burst": 1.0},
            "maintenance": [{"cron": "30 1 1 * *", "duration": 600, "timezone": "UTC"}],
        },
        "delta": {"maintenance": [{"cron": "0 0 * * *", "duration": 60, "timezone": "Asia/Tokyo"}]},
    }
    before, stored_windows = state(r, keys), windows(r, keys)
    # checks, jobs, the bucket in each partition, 3 window scopes
    assert len(before) == 3 + 5 + keys.partitions + 3
    path = tmp_path / "exported.yaml"
    path.write_text(exported)
    assert "user:***@h1.example" in exported and "user:pw@" not in exported
    assert "no changes (3 check(s) already match)" in cli("apply", "-f", str(path), "--prune")
    assert state(r, keys) == before  # the masked password stood for the stored one
    # to a fresh store and back out: the same text; a masked file has no password to give it
    full = cli("export", "--include-secrets")
    assert "user:pw@h1.example" in full
    r.flushdb()
    refused = cli("apply", "-f", str(path), ok=False)
    assert "checks[0].target (uid 'h1'): is '***', the mask `checks export` writes" in refused
    assert r.dbsize() == 0
    path.write_text(full)
    assert "applied: 3 created, 0 updated, 0 deleted, 1 rate limit(s) changed, 4 window(s)" in (
        cli("apply", "-f", str(path))
    )
    assert store.get("h1").definition.target == "https://user:pw@h1.example/x"
    assert windows(r, keys) == stored_windows
    assert cli("export") == exported
    assert cli("export", "--include-secrets") == full
    assert not store.get("t1").definition.enabled
    one = yaml.safe_load(cli("export", "--tenant", "acme"))
    assert [c["uid"] for c in one["checks"]] == ["h1"] and "tenants" not in one
    assert len(one["checks"][0]["maintenance"]) == 2


def test_a_check_changed_between_diff_and_write_ends_as_the_file_says(store, settings, r):
    import workers.probes  # noqa: F401 - the http kind
    from celery_app.checks.manifest_sync import apply_plan, plan_manifest

    store.create(**check(1))
    store.create(**check(2))
    text = yaml.safe_dump({"version": 1, "checks": [check(1, period=30), check(2), check(3)]})
    plan = plan_manifest(store, load_manifest(text, settings))
    assert [new.uid for _old, new in plan.updates] == ["web1"] and len(plan.creates) == 1
    store.update("web1", period=90)  # its version moves on: the planned batch is refused
    store.create(**check(3, period=120))  # created meanwhile: the create is refused too
    done = apply_plan(store, plan)
    assert (done.created, done.updated) == (1, 1)
    assert store.get("web1").definition.period == 30
    assert store.get("web3").definition.period == 60
    assert store.get("web2").version == 1


def test_a_json_file_is_a_checks_file_too(cli, store, tmp_path):
    import json

    path = tmp_path / "checks.json"
    document = {"version": 1, "checks": [check(1), check(2, period="soon")]}
    path.write_text(json.dumps(document, indent=2))
    out = cli("apply", "-f", str(path), ok=False)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"soon"' in text)
    assert f"checks.json:{line}: checks[1].period (uid 'web2'): must be an integer" in out
    document["checks"][1]["period"] = 60
    path.write_text(json.dumps(document))
    assert "applied: 2 created" in cli("apply", "-f", str(path))


# --- what a file may not hold: refused before any work, one line, exit 2 --------------------------


def refused(cli, path) -> str:
    """``apply -f path`` refused: exit 2, one ``Error:`` line, no traceback; that line."""
    out = cli("apply", "-f", str(path), ok=False)
    assert cli.exit_code == 2, out
    assert "Traceback" not in out
    (line,) = out.splitlines()
    assert line.startswith("Error: ") and line.endswith("(nothing written)"), line
    return line


WEB1 = """\
version: 1
checks:
  - uid: web1
    tenant: acme
    kind: http
    target: https://svc-1.example.com/health
    period: 60
    config:
      headers: {Authorization: Bearer s3cret}
"""


def test_a_key_twice_in_a_mapping_is_refused_naming_both_lines(cli, r, keys, tmp_path):
    """The second ``uid`` of an entry would name another check and overwrite it."""
    first = tmp_path / "first.yaml"
    first.write_text(WEB1)
    cli("apply", "-f", str(first))
    before = state(r, keys)
    twice = tmp_path / "checks.yaml"
    twice.write_text(
        "version: 1\n"
        "checks:\n"
        "  - uid: dk\n"  # line 3
        "    tenant: acme\n"
        "    kind: http\n"
        "    target: https://attacker.example/\n"
        "    period: 60\n"
        "    uid: web1\n"  # line 8
    )
    line = refused(cli, twice)
    assert line == (
        f"Error: {twice}:8: the key 'uid' appears twice in one mapping (lines 3 and 8); "
        "a key may appear once (nothing written)"
    )
    assert state(r, keys) == before  # web1 keeps its target and its Authorization header


def test_a_key_twice_in_a_json_object_is_refused_naming_both_lines(cli, r, tmp_path):
    path = tmp_path / "checks.json"
    path.write_text(
        '{"version": 1,\n'
        ' "checks": [{"uid": "dk", "tenant": "acme", "kind": "tcp",\n'
        '             "target": "example.com:443", "period": 60,\n'
        '             "uid": "web1"}]}\n'
    )
    line = refused(cli, path)
    assert f"{path}:4: the key 'uid' appears twice in one mapping (lines 2 and 4)" in line
    assert r.dbsize() == 0


def test_nested_aliases_are_refused_before_they_expand(cli, r, tmp_path):
    """Nine levels of nine aliases stand for 9**9 values in a file of a few hundred bytes:
    refused after walking about as many values as the file has characters."""
    lines = ["version: 1", "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for n in range(1, 10):
        lines.append(f"x{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]")
    lines += [
        "checks:",
        "  - {uid: bomb, tenant: acme, kind: http, target: 'https://a.example/', period: 60,",
        "     config: {json_path: a, json_expected: *a9}}",
    ]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 1024
    started = time.process_time()
    line = refused(cli, path)
    assert time.process_time() - started < 2.0  # 9**9 values would take minutes and gigabytes
    assert "expands to more than 10," in line and "YAML aliases (*name)" in line
    assert r.dbsize() == 0


def test_aliases_that_repeat_a_little_are_accepted(cli, store, tmp_path):
    """What ``yaml.dump`` writes for a shared value, and a merge key overriding what it merges:
    within the bound, and a key the merge brings is not a duplicate."""
    path = tmp_path / "checks.yaml"
    path.write_text(
        "version: 1\n"
        "defaults: &defaults {tenant: acme, kind: tcp, period: 60}\n"
        "checks:\n"
        "  - {<<: *defaults, uid: a1, target: 'a.example:443'}\n"
        "  - {<<: *defaults, uid: a2, target: 'b.example:443', period: 30}\n"
    )
    out = cli("apply", "-f", str(path), ok=False)  # "defaults" is not a key of the format
    assert "defaults: unknown key" in out and "appears twice" not in out
    path.write_text(path.read_text().replace("defaults: &defaults", "version_: &defaults"))
    path.write_text(
        "version: 1\n"
        "checks:\n"
        "  - &first {uid: a1, tenant: acme, kind: tcp, target: 'a.example:443', period: 60}\n"
        "  - {<<: *first, uid: a2, period: 30}\n"
    )
    assert "2 created" in cli("apply", "-f", str(path))
    assert store.get("a2").definition.period == 30
    assert store.get("a2").definition.target == "a.example:443"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("deep.json", '{"version": 1, "checks": ' + "[" * 5000 + "]" * 5000 + "}",
         "deep.json:1: is nested more than 32 levels deep"),
        ("deep.yaml", "version: 1\nchecks:\n  - " + "[" * 40 + "]" * 40 + "\n",
         "deep.yaml:3: checks[0][0][0][0][0]...: is nested more than 32 levels deep"),
        ("long.json", '{"version": 1,\n "checks": [{"period": ' + "9" * 5000 + "}]}",
         "long.json:2: is an integer of 5,000 digits; at most 40 digits are allowed"),
        ("long.yaml", "version: 1\nchecks:\n  - period: " + "9" * 5000 + "\n",
         "long.yaml:3: is an integer of 5,000 digits; at most 40 digits are allowed"),
        ("inf.yaml", "version: 1\nchecks:\n  - {uid: a, period: .inf}\n",
         "inf.yaml:3: checks[0].period: must be a finite number"),
    ],
)  # fmt: skip
def test_nesting_and_numbers_past_their_bounds_are_one_line(cli, r, tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    line = refused(cli, path)
    assert line.startswith(f"Error: {tmp_path}/{expected}"), line
    assert r.dbsize() == 0


def test_a_file_past_the_size_cap_is_refused_unread(cli, r, tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing to write, 64 MiB to read
    line = refused(cli, path)
    assert line == (
        f"Error: {path}: is larger than 64 MiB, the most a checks file may be; split it (one "
        "file per tenant or team: --prune acts only on the tenants a file names) "
        "(nothing written)"
    )
    assert r.dbsize() == 0


def test_a_header_value_from_a_block_scalar_is_refused_naming_the_header(cli, r, tmp_path):
    """``|`` keeps the final newline: the header could never be sent, and the token would
    appear in every run's error."""
    path = tmp_path / "checks.yaml"
    path.write_text(
        WEB1.replace(
            "      headers: {Authorization: Bearer s3cret}\n",
            "      headers:\n        Authorization: |\n          Bearer s3cret\n",
        )
    )
    line = refused(cli, path)
    assert (
        f"{path}:9: checks[0].config.headers (uid 'web1'): value of 'Authorization' contains "
        "a line break (CR or LF), which HTTP does not allow; a YAML block scalar (|) ends in "
        "one: use |- or a quoted string" in line
    )
    assert "s3cret" not in line
    assert r.dbsize() == 0


def test_a_file_on_stdin_is_read_and_judged_the_same(cli, r, store):
    assert "1 created" in cli("apply", "-f", "-", input=WEB1)
    assert store.get("web1").definition.config["headers"] == {"Authorization": "Bearer s3cret"}
    out = cli("apply", "-f", "-", input=WEB1 + "    uid: web2\n", ok=False)
    assert cli.exit_code == 2
    assert out == (
        "Error: <stdin>:10: the key 'uid' appears twice in one mapping (lines 3 and 10); "
        "a key may appear once (nothing written)\n"
    )
