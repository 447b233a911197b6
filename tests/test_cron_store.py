"""The cron store's Lua against a real Redis: keys only from KEYS, field names only from schema."""

from __future__ import annotations

import re
from datetime import timedelta
from importlib import resources

import pytest
from support.cron import T0, store_of

from celery_app.cron_tasks.cron_state import CHUNK, FireRequest
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks, window_id
from celery_app.redis.schema import (
    CronClaimCode,
    CronGapField,
    CronOutcome,
    CronPendingField,
    CronSkipReason,
    CronStateField,
    CronStatsField,
    Keys,
)

KEYS = Keys("cbtest")
MIN = timedelta(minutes=1)
CRON_LUA = ("cron_claim", "cron_finish", "cron_gaps", "cron_ref", "cron_start", "cron_takeover")


def _lua(name: str) -> str:
    return resources.files("celery_app").joinpath("redis", "lua", f"{name}.lua").read_text()


def _code(source: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in source.splitlines())


@pytest.mark.parametrize("name", CRON_LUA)
def test_every_key_a_cron_script_touches_comes_from_keys(name):
    code = _code(_lua(name))
    # names bound to KEYS entries, e.g. "local win, infl = KEYS[1], KEYS[2]"
    bound: set[str] = set()
    for names in re.findall(r"local ([\w, ]+) = KEYS\[", code):
        bound.update(n.strip() for n in names.split(","))
    calls = re.findall(r"redis\.call\('(\w+)', ([^,)]+)", code)
    assert calls, name
    for command, key in calls:
        assert key.startswith("KEYS[") or key in bound, f"{name}: {command} on {key}"


@pytest.mark.parametrize("name", CRON_LUA)
def test_cron_scripts_spell_no_field_name_of_their_own(name):
    code = _code(_lua(name))
    literals = set(re.findall(r"'([^']*)'", code))
    enums = (CronStateField, CronStatsField, CronGapField, CronPendingField)
    names = {str(f) for enum in enums for f in enum}
    assert not literals & names, f"{name} spells {literals & names}"


def _noop(tenant: str | None = None) -> None: ...


def _declare(app, task_id, **options):
    return cron("* * * * *", app=app, id=task_id, name=f"store.{task_id}", **options)(_noop)


def test_a_chunked_claim_fires_each_entry_once_and_writes_only_schema_fields(cron_app, r):
    count = CHUNK + 7  # two claim calls in one pipeline
    for i in range(count):
        _declare(cron_app, f"s{i}")
    _declare(cron_app, "multi", singleton=False)
    tasks = cron_tasks(cron_app)
    store = store_of(cron_app)
    requests = [FireRequest(task, GLOBAL_TENANT, T0) for task in tasks.values()]
    first = store.claim(requests, now=T0, owner="a")
    assert list(first) == [CronClaimCode.FIRE] * len(requests)
    assert all(isinstance(code, CronClaimCode) for code in first)
    again = store.claim(requests, now=T0, owner="b")
    # singletons are taken by "a"; the non-singleton has no key and fires again
    assert [code for req, code in zip(requests, again, strict=True) if req.task.singleton] == [
        CronClaimCode.TAKEN
    ] * count
    assert again[list(tasks).index("multi")] == CronClaimCode.FIRE
    assert r.get(KEYS.cron_window("s0", GLOBAL_TENANT, window_id(T0))) == "a"
    assert r.get(KEYS.cron_inflight("s0", GLOBAL_TENANT)) == window_id(T0)
    # the next window while s0's run is in flight: consumed and recorded as skipped
    later = store.claim(
        [FireRequest(tasks["s0"], GLOBAL_TENANT, T0 + MIN)], now=T0 + MIN, owner="a"
    )
    assert list(later) == [CronClaimCode.IN_FLIGHT]
    state = r.hgetall(KEYS.cron_state("s0", GLOBAL_TENANT))
    assert state[CronStateField.LAST_SKIP_REASON] == CronSkipReason.IN_FLIGHT
    assert (state[CronStateField.FIRED], state[CronStateField.SKIPPED]) == ("1", "1")
    store.run_started("s0", GLOBAL_TENANT, window_id(T0), False, T0, celery_id="c-1")
    store.run_finished("s0", GLOBAL_TENANT, window_id(T0), CronOutcome.FAILURE, "boom", T0 + MIN)
    assert r.get(KEYS.cron_inflight("s0", GLOBAL_TENANT)) is None
    assert r.hget(KEYS.cron_failing(), f"s0|{GLOBAL_TENANT}") == "boom"
    stats = r.hgetall(KEYS.cron_stats("s0"))
    assert stats[CronStatsField.LAST_OUTCOME] == CronOutcome.FAILURE
    assert stats[CronStatsField.LAST_WINDOW] == str(int((T0 + MIN).timestamp()))
    # every field the scripts and the store wrote is one the schema names
    for i in range(count):
        assert set(r.hgetall(KEYS.cron_state(f"s{i}", GLOBAL_TENANT))) <= set(CronStateField)
        assert set(r.hgetall(KEYS.cron_stats(f"s{i}"))) <= set(CronStatsField)


def test_marks_move_the_last_window_only_and_gaps_are_recorded_once(cron_app, r):
    _declare(cron_app, "tenanted", per_tenant=True)
    task = cron_tasks(cron_app)["tenanted"]
    store = store_of(cron_app)
    claim = store.claim([], now=T0, owner="a", marks=[(task, T0)])
    assert list(claim) == []
    assert r.hgetall(KEYS.cron_stats("tenanted")) == {
        CronStatsField.LAST_WINDOW: str(int(T0.timestamp()))
    }
    assert not r.exists(KEYS.cron_state("tenanted", GLOBAL_TENANT))
    # a window before the last handled one is no gap; a later one is, once
    assert store.record_gaps([(task, T0 - 2 * MIN, T0 - MIN)], T0, "test") == 0
    assert store.record_gaps([(task, T0 + MIN, T0 + 3 * MIN)], T0 + 4 * MIN, "test") == 1
    assert store.record_gaps([(task, T0 + MIN, T0 + 3 * MIN)], T0 + 4 * MIN, "again") == 0
    (gap,) = store.gaps()
    assert set(gap) <= set(CronGapField)
    assert (gap[CronGapField.TASK], gap[CronGapField.DETECTOR]) == ("tenanted", "test")


def test_a_custom_window_fires_once_per_shared_last_run_and_moves_it(cron_app, r):
    cron_app.conf.beat_schedule = {
        "rel": {"task": "t.rel", "schedule": timedelta(minutes=2), "relative": True}
    }
    from celery_app.cron_tasks.task_sources import all_tasks

    task = all_tasks(cron_app)["rel"]
    assert task.is_custom
    store = store_of(cron_app)
    last = store.note_refs([task], T0)["rel"]
    assert last == str(int(T0.timestamp()))
    due_at = T0 + 2 * MIN

    def claim(ref: str, owner: str):
        req = FireRequest(task, GLOBAL_TENANT, due_at, wid=f"after-{ref}", ref=ref)
        return list(store.claim([req], now=due_at, owner=owner))

    # two beats read the same last run: one fires, the other finds the window taken
    assert claim(last, "a") == [CronClaimCode.FIRE]
    assert claim(last, "b") == [CronClaimCode.TAKEN]
    # the fire moved the last run to the claim's time, in the same script
    moved = r.get(KEYS.cron_ref("rel", task.fingerprint))
    assert float(moved) == due_at.timestamp()
    # a beat that read the old last run before the move cannot fire it under another window id
    stale = FireRequest(task, GLOBAL_TENANT, due_at, wid="another-name", ref=last)
    assert list(store.claim([stale], now=due_at, owner="c")) == [CronClaimCode.TAKEN]
    assert r.hget(KEYS.cron_stats("rel"), CronStatsField.FIRED) == "1"
