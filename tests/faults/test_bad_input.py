"""Bad input is refused with an error naming the field, and nothing is written.

Cron specs (every invalid form of the parser's own error tests, through the decorator), check
definitions, run messages a worker receives, and agent-reported start times.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from fault_procs import LogLines
from support.completion import finish
from support.cron_spec_errors import FIELD_ERRORS
from support.partitions import suite_keys
from support.polling import wait_for
from support.state_db import snapshot

from celery_app.checks.jobs import from_unix, read_job
from celery_app.checks.run_contract import RUN_CHECK_TASK
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import TRANSITION_TASK
from celery_app.cron_tasks.registration import CronSpecError, cron, cron_tasks
from celery_app.errors import CheckFieldError
from celery_app.redis.schema import job_id
from scheduling_core import Params, PostExecInput

pytestmark = pytest.mark.faults

KEYS = suite_keys("cbtest")

# Forms the parser refuses besides FIELD_ERRORS' (tests/test_cron_errors.py tests each message).
OTHER_BAD_SPECS = [
    "* * * * * *",  # seconds
    "0 0 0 1 1 * 2026",
    "* * * *",  # field counts
    "1 2 3 4 5 6 7 8",
    "",
    "   ",
    "0 0 1, 15 * *",  # a space next to a comma
    "@reboot",
    "@every 5m",
    "@minutely",
]
BAD_SPECS = [spec for spec, *_ in FIELD_ERRORS] + OTHER_BAD_SPECS


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_every_invalid_cron_spec_fails_at_decoration_and_registers_nothing(cron_app, r, spec):
    before = set(cron_app.tasks)
    with pytest.raises(CronSpecError) as caught:

        @cron(spec, app=cron_app, id="bad-task", name="faults.bad")
        def bad() -> None: ...

    message = str(caught.value)
    assert "bad-task" in message and repr(spec) in message
    assert cron_tasks(cron_app) == {}
    assert set(cron_app.tasks) == before
    assert r.dbsize() == 0


VALID = {
    "uid": "c1",
    "tenant": "acme",
    "kind": "http",
    "target": "https://example.com/health",
    "period": 60,
}

BAD_DEFINITIONS = [
    # (field, override, phrase in the message)
    ("target", {"target": "ftp://example.com/"}, "http"),
    ("target", {"target": "example.com/health"}, ""),
    ("target", {"target": "http://"}, "host"),
    ("target", {"target": "http://example.com:99999/"}, "port"),
    ("target", {"target": "http://10.0.0.1/"}, "private"),
    ("target", {"target": "http://169.254.169.254/latest/meta-data"}, ""),
    ("target", {"target": ""}, "non-empty"),
    ("target", {"kind": "tcp", "target": "example.com"}, "host:port"),
    ("target", {"kind": "tcp", "target": "example.com:0"}, "1..65535"),
    ("period", {"period": 0}, ">= 1"),
    ("period", {"period": -60}, ">= 1"),
    ("period", {"period": 1.5}, "integer"),
    ("period", {"period": "often"}, "integer"),
    ("period", {"period": True}, "integer"),
    ("period", {"period": None}, "integer"),
    ("regions", {"regions": ["mars"]}, "unknown region 'mars'"),
    ("regions", {"regions": ["local", "local"]}, "distinct"),
    ("region_spread", {"region_spread": -1}, "0 <= region_spread < period"),
    ("region_spread", {"region_spread": 60}, "0 <= region_spread < period"),
    ("region_spread", {"region_spread": float("nan")}, "0 <= region_spread < period"),
    ("region_spread", {"region_spread": "wide"}, "number of seconds"),
    ("plan_weight", {"plan_weight": -1}, ">= 0"),
    ("plan_weight", {"plan_weight": "gold"}, "integer"),
    ("plan_weight", {"plan_weight": 2.5}, "integer"),
    ("kind", {"kind": "gopher"}, "unknown kind 'gopher'"),
    ("kind", {"kind": ""}, "non-empty"),
    ("config", {"config": "{not json"}, "JSON"),
    ("config", {"config": ["a"]}, "object"),
    ("uid", {"uid": "a@b"}, "not allowed"),
    ("tenant", {"tenant": "a b"}, "not allowed"),
    ("enabled", {"enabled": "yes"}, "true or false"),
    ("colour", {"colour": "red"}, "unknown field"),
    # bounds of the http kind's config, and of any config (docs/security.md, "Limits")
    ("config.headers", {"config": {"headers": {"Authorization": "Bearer t\n"}}}, "line break"),
    ("config.headers", {"config": {"headers": {"X-A": "a\x00b"}}}, "contains NUL"),
    ("config.headers", {"config": {"headers": {"Bad Name:": "x"}}}, "not an HTTP field name"),
    ("config.headers", {"config": {"headers": {"X-A": "1", "x-a": "2"}}}, "appears twice"),
    (
        "config.headers",
        {"config": {"headers": {f"H{i}": "v" for i in range(20_000)}}},
        "has 20,000 headers; at most 100 are allowed",
    ),
    (
        "config.headers",
        {"config": {"headers": {"X-Api-Key": "k" * 5_000_000}}},
        "value of 'X-Api-Key' is 5,000,000 characters; at most 8,192 are allowed",
    ),
    (
        "config.body_contains",
        {"config": {"body_contains": "b" * 5_000_000}},
        "is 5,000,000 characters long; at most 8,192 are allowed",
    ),
    (
        "config",
        {"config": {"headers": {f"X-{i}": "v" * 8000 for i in range(9)}}},
        "bytes as JSON; at most 65,536 are allowed",
    ),
    ("config", {"config": "[" * 5000 + "]" * 5000}, "is nested more than 32 levels deep"),
    (
        "config.json_expected[0][0][0][0][0]...",
        {"config": {"json_path": "a", "json_expected": json.loads("[" * 40 + "]" * 40)}},
        "is nested more than 32 levels deep",
    ),
    (
        "config",
        {"config": '{"max_latency_ms": ' + "9" * 5000 + "}"},
        "is an integer of 5,000 digits; at most 40",
    ),
    (
        "config.max_latency_ms",
        {"config": {"max_latency_ms": 10**5000}},
        "is an integer of 5,001 digits",
    ),
]


@pytest.mark.parametrize(("field", "override", "phrase"), BAD_DEFINITIONS)
def test_a_bad_check_definition_names_the_field_and_writes_nothing(
    make_app, r, field, override, phrase
):
    app = make_app()
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="existing", tenant="acme", kind="tcp", target="example.com:443", period=30)
    before = snapshot(r)
    with pytest.raises(CheckFieldError) as caught:
        store.create(**(VALID | override))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert phrase in str(caught.value)
    assert snapshot(r) == before
    # the same input as an update of an existing check is refused the same way
    if field not in ("uid", "colour"):
        with pytest.raises(CheckFieldError):
            store.update("existing", **{k: v for k, v in override.items()})
        assert snapshot(r) == before


GOOD_KWARGS = {
    "job_id": "missing@local",
    "lease_token": "1.1",
    "scheduled_at": 1.0,
    "effective_scheduled_at": 1.0,
    "timeout_s": 5.0,
}

BAD_MESSAGES = [
    ("missing lease_token", (), {k: v for k, v in GOOD_KWARGS.items() if k != "lease_token"}),
    ("job_id not a string", (), GOOD_KWARGS | {"job_id": 17}),
    ("job_id without region", (), GOOD_KWARGS | {"job_id": "no-region"}),
    ("scheduled_at a string", (), GOOD_KWARGS | {"scheduled_at": "yesterday"}),
    ("timeout_s negative", (), GOOD_KWARGS | {"timeout_s": -1}),
    ("timeout_s a bool", (), GOOD_KWARGS | {"timeout_s": True}),
    ("timeout_s 10**400", (), GOOD_KWARGS | {"timeout_s": 10**400}),
    ("timeout_s an hour, past the ceiling", (), GOOD_KWARGS | {"timeout_s": 3600}),
    ("scheduled_at 10**400", (), GOOD_KWARGS | {"scheduled_at": 10**400}),
    ("lease_token empty", (), GOOD_KWARGS | {"lease_token": ""}),
    ("positional args", ("missing@local",), {}),
    ("unknown job id", (), GOOD_KWARGS),
]


@pytest.mark.timeout(60)
def test_bad_run_messages_are_rejected_and_logged_and_the_worker_keeps_going(
    make_app, r, run_worker, claim, target, allow_private, fault_report
):
    logged = LogLines("workers.tasks")
    app = make_app(allow_private_targets=True)
    store = CheckStore(r, KEYS, app.conf.checkbeat_settings)
    store.create(uid="good", tenant="acme", kind="http", target=target.url("/delay/1"), period=60)
    job = job_id("good", "local")
    run_worker(app, ["checks.local.fast"], concurrency=1)
    before = snapshot(r)
    queue = "checks.local.fast"
    for _name, args, kwargs in BAD_MESSAGES:
        app.send_task(RUN_CHECK_TASK, args=args, kwargs=kwargs, queue=queue)
    rejected = "rejected run_check"
    wait_for(
        lambda: logged.text.count(rejected) >= len(BAD_MESSAGES),
        20,
        what="every bad message to be rejected",
    )
    assert snapshot(r) == before  # nothing written, no job key created for the unknown id
    assert "unknown job missing@local" in logged.text
    assert "lease_token must be a non-empty string" in logged.text
    assert "scheduled_at must be a number" in logged.text
    assert "timeout_s must be at most 17 s" in logged.text
    assert "scheduled_at must be between 0 and" in logged.text
    # ... and the same worker still runs a real job
    kwargs = claim(r, KEYS, job, "9.1")
    app.send_task(RUN_CHECK_TASK, kwargs=kwargs, queue=queue)
    wait_for(lambda: read_job(r, KEYS, job).runs == 1, 20, what="the good run after the bad ones")
    assert r.xlen(KEYS.results("good")) == 1
    logging.getLogger("workers.tasks").removeHandler(logged)
    fault_report.add(
        "bad run messages, then a good one",
        runs=len(BAD_MESSAGES) + 1,
        rejected=logged.text.count(rejected),
    )


#: deliver_transition messages nobody but a forger sends (publish.py sends one keyword, a string).
FORGED_TRANSITIONS = [
    ("id a list", (), {"transition_id": ["a#1"]}),
    ("id an object", (), {"transition_id": {"a": 1}}),
    ("id null", (), {"transition_id": None}),
    ("id a number", (), {"transition_id": 17}),
    ("id 100,000 characters", (), {"transition_id": "a#" + "1" * 100_000}),
    ("no id", (), {}),
    ("an extra argument", (), {"transition_id": "a#1", "more": 1}),
]


@pytest.mark.timeout(60)
def test_forged_transition_messages_are_one_log_line_each_and_dropped(make_app, r, run_worker):
    logged = LogLines("workers.deliver_transition")
    traced = LogLines("celery.app.trace")  # where Celery logs a task's exception
    app = make_app()
    queue = app.conf.checkbeat_settings.transition_queue
    run_worker(app, [queue], concurrency=1)
    before = snapshot(r)
    for _name, args, kwargs in FORGED_TRANSITIONS:
        app.send_task(TRANSITION_TASK, args=args, kwargs=kwargs, queue=queue)
    rejected = "rejected deliver_transition"
    wait_for(
        lambda: logged.text.count(rejected) >= len(FORGED_TRANSITIONS),
        20,
        what="every forged message to be rejected",
    )
    # a well-formed id that is in no outbox is dropped as before, after the forged ones
    app.send_task(TRANSITION_TASK, kwargs={"transition_id": "nope#1"}, queue=queue)
    wait_for(lambda: "nope#1 not delivered again" in logged.text, 20, what="the unknown id")
    assert logged.text.count(rejected) == len(FORGED_TRANSITIONS)  # one line each, no retry
    assert "transition_id must be a string, got list" in logged.text
    assert "of at most 221 characters" in logged.text and "1" * 300 not in logged.text
    assert "raised unexpected" not in traced.text and "DataError" not in traced.text
    assert snapshot(r) == before
    for name in ("workers.deliver_transition", "celery.app.trace"):
        logging.getLogger(name).removeHandler(
            logged if name == "workers.deliver_transition" else traced
        )


# --- agent-reported start times: floored, never steer order or lane ---------------------------

#: Any fixed instant: the post-exec math is pure and never reads the real clock.
T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "exec_start",
    [T + timedelta(days=3650), T - timedelta(days=3650), T + timedelta(hours=1), None],
    ids=["10y-future", "10y-past", "1h-future", "unknown"],
)
def test_an_absurd_start_time_changes_no_order_and_no_lane(exec_start):
    params = Params()
    base = dict(
        prev_cost_ewma_ms=120.0,
        prev_delay_ewma_ms=40.0,
        prev_lane=0,
        plan_weight=2,
        scheduled_at=T,
        effective_scheduled_at=T,
        duration_ms=150.0,
        timed_out=False,
        next_scheduled_at=T + timedelta(minutes=1),
    )
    honest = params.post_exec(PostExecInput(**base, exec_start=T + timedelta(milliseconds=5)))
    skewed = params.post_exec(PostExecInput(**base, exec_start=exec_start))
    assert skewed.effective_scheduled_at == honest.effective_scheduled_at
    assert skewed.lane == honest.lane
    assert skewed.cost_ewma_ms == honest.cost_ewma_ms
    assert skewed.delay_ewma_ms >= 0.0
    if exec_start is not None and exec_start < T:
        # a start before the schedule is floored at 0 lateness, never a negative delay
        assert skewed.delay_ewma_ms <= base["prev_delay_ewma_ms"]


def test_a_run_finished_with_far_future_and_past_starts_keeps_the_wfq_order(make_app, r, claim):
    app = make_app()
    settings = app.conf.checkbeat_settings
    store = CheckStore(r, KEYS, settings)
    params = Params.from_settings(settings)
    now = from_unix(time.time())
    deadlines = {}
    for uid, start in (
        ("future", now + timedelta(days=3650)),
        ("past", now - timedelta(days=3650)),
        ("honest", now),
    ):
        store.create(uid=uid, tenant="acme", kind="tcp", target="example.com:443", period=60)
        job = job_id(uid, "local")
        claim(r, KEYS, job, f"{uid}.1")
        assert finish(
            r, KEYS, settings, job, f"{uid}.1", params=params,
            duration_ms=80.0, exec_start=start, now=now,
        )[0]  # fmt: skip
        state = read_job(r, KEYS, job)
        assert state.delay_ewma_ms >= 0.0
        assert state.lane == 0
        # the deadline is the next tick plus the cost offset: the start time plays no part
        deadlines[uid] = state.effective_scheduled_at - state.scheduled_at
    assert deadlines["future"] == pytest.approx(deadlines["honest"], abs=1e-3)
    assert deadlines["past"] == pytest.approx(deadlines["honest"], abs=1e-3)
