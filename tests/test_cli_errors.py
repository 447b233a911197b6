"""Every ``celery -A celery_app schedule|checks|tenants`` command fails the same way when it cannot
run: one line on stderr naming the URL (password masked) and the variable, exit code 2, no
traceback. ``diagnose`` exits 1 when it reports anything and 0 when healthy.

Real ``python -m celery`` subprocesses (the installed entry points), a real closed port, a real
listener that never answers, and the suite's real redis-server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.checks import register_fake_worker
from support.partitions import suite_keys
from support.projects import run_module

from celery_app.cli.common import EXIT_CANNOT_RUN, CannotRun, reported_as_cannot_run
from celery_app.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cret-pw"

USER_TASKS = """
from celery_app import cron

@cron("*/5 * * * *", id="report")
def report(): ...
"""

#: One invocation of every subcommand; each would read or write Redis.
COMMANDS = [
    "schedule list",
    "schedule run report",
    "schedule diagnose",
    "tenants add acme",
    "tenants rm acme",
    "tenants list",
    "checks add web1 --tenant acme --kind tcp --target example.com:443 --period 60",
    "checks update web1 --period 30",
    "checks rm web1",
    "checks enable web1",
    "checks disable web1",
    "checks show web1",
    "checks list",
    "checks costs",
    "checks ratelimit acme",
    "checks reconcile",
    "checks diagnose",
    "checks transitions web1",
    "checks report web1 --from 2026-11-01 --to 2026-12-01",
    "checks maintenance list",
    "checks maintenance add --check web1 --cron 0_3_*_*_* --duration 600",
    "checks maintenance rm w1",
]


def celery(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "cli_user_tasks.py").write_text(textwrap.dedent(USER_TASKS))
    return run_module(
        "celery", "-A", "celery_app", *args, cwd=tmp_path, pythonpath=[REPO, tmp_path],
        CHECKBEAT_IMPORTS="cli_user_tasks", **env,
    )  # fmt: skip


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def assert_one_line_cannot_run(done: subprocess.CompletedProcess[str], expected: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_CANNOT_RUN, output
    assert "Traceback" not in output
    assert done.stderr.splitlines() == [f"Error: {expected}"], output
    assert done.stdout == ""
    assert SECRET not in output


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c.split()[:2]) for c in COMMANDS])
def test_every_command_reports_an_unreachable_redis_in_one_line_and_exits_2(
    tmp_path, closed_port, command
):
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port}/1"
    args = [arg.replace("_", " ") if arg.startswith("0_") else arg for arg in command.split()]
    done = celery(tmp_path, *args, CHECKBEAT_REDIS_URL=url, CHECKBEAT_BROKER_URL=url)
    assert_one_line_cannot_run(
        done,
        f"cannot reach Redis at redis://:***@127.0.0.1:{closed_port}/1 (Connection refused); "
        "is it running? (CHECKBEAT_REDIS_URL)",
    )


def test_a_redis_that_never_answers_is_reported_as_timed_out(tmp_path, silent_port):
    url = f"redis://127.0.0.1:{silent_port}/1?socket_timeout=0.5&socket_connect_timeout=0.5"
    done = celery(tmp_path, "tenants", "list", CHECKBEAT_REDIS_URL=url)
    assert_one_line_cannot_run(
        done,
        f"cannot reach Redis at {url} (timed out); is it running? (CHECKBEAT_REDIS_URL)",
    )


def test_an_unreachable_broker_is_named_as_the_broker(tmp_path, closed_port, r, broker_url):
    """State Redis up, broker down: ``schedule run`` names CHECKBEAT_BROKER_URL, not the state."""
    broker = f"redis://127.0.0.1:{closed_port}/0"
    done = celery(tmp_path, "schedule", "run", "report", CHECKBEAT_BROKER_URL=broker)
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_CANNOT_RUN, output
    assert "Traceback" not in output
    (line,) = done.stderr.splitlines()
    assert line.startswith("Error: cannot reach ")
    assert f"at {broker} (Connection refused); is it running? (CHECKBEAT_BROKER_URL)" in line


def test_checks_diagnose_exits_1_when_it_reports_a_problem_and_0_when_healthy(tmp_path, r):
    no_worker = celery(tmp_path, "checks", "diagnose")
    assert no_worker.returncode == 1, no_worker.stdout + no_worker.stderr
    assert "PROBLEM: region local: no live worker" in no_worker.stdout
    as_json = celery(tmp_path, "checks", "diagnose", "--json")
    assert as_json.returncode == 1, as_json.stderr
    (problem,) = json.loads(as_json.stdout)  # the list `schedule diagnose --json` prints too
    assert set(problem) == {"kind", "subject", "message", "since"}
    assert (problem["kind"], problem["subject"], problem["since"]) == (
        "no_live_worker",
        "local",
        None,
    )
    assert f"PROBLEM: {problem['message']}" in no_worker.stdout  # the text form prints the message

    for part in suite_keys("cbtest").every_partition():  # slots in every partition: healthy
        register_fake_worker(r, part, "w1", region="local", role="shared", concurrency=2)
    healthy = celery(tmp_path, "checks", "diagnose")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "no problems" in healthy.stdout
    healthy_json = celery(tmp_path, "checks", "diagnose", "--json")
    assert healthy_json.returncode == 0, healthy_json.stderr
    assert json.loads(healthy_json.stdout) == []


def test_invalid_settings_in_a_command_are_one_line_naming_each_variable():
    with pytest.raises(CannotRun) as caught, reported_as_cannot_run(load_settings):
        load_settings(pool_size=0, regions=["eu", "eu"])
    message = caught.value.format_message()
    assert caught.value.exit_code == EXIT_CANNOT_RUN
    assert "\n" not in message
    assert message.startswith("invalid checkbeat configuration: CHECKBEAT_")
    assert "CHECKBEAT_POOL_SIZE" in message and "CHECKBEAT_REGIONS" in message


def test_checkbeat_status_reports_an_unreachable_redis_in_one_line_and_exits_2(
    tmp_path, closed_port
):
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port}/1"
    done = run_module(
        "celery_app.cli.main", "status", "--data-dir", str(tmp_path), cwd=tmp_path,
        pythonpath=[REPO], CHECKBEAT_REDIS_URL=url,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_CANNOT_RUN, output
    assert "Traceback" not in output and SECRET not in output
    assert done.stderr.splitlines() == [
        f"checkbeat status: cannot reach Redis at redis://:***@127.0.0.1:{closed_port}/1 "
        "(Connection refused); is it running? (CHECKBEAT_REDIS_URL); `checkbeat up` starts one"
    ]


# --- bad input: one line naming the field, exit 2, nothing written ------------------------------

DEEP_JSON = "[" * 5000 + "]" * 5000
HUGE_INT = "9" * 5000
HTTP_CHECK = "checks add web9 --tenant acme --kind http --target https://example.com/ --period 60"
#: A runtime schedule of a task every app knows (Celery's own).
SCHEDULE = "schedule add rt1 --task celery.backend_cleanup --every 20s"

#: (command, extra arguments kept whole, the one stderr line's start after "Error: ").
BAD_INPUTS = [
    (
        HTTP_CHECK,
        ["--config", '{"headers": {"Authorization": "Bearer t0k3n\\n"}}'],
        "config.headers: value of 'Authorization' contains a line break (CR or LF)",
    ),
    (
        HTTP_CHECK,
        ["--config", '{"headers": {"Bad Name:": "x"}}'],
        "config.headers: name 'Bad Name:' is not an HTTP field name",
    ),
    (
        HTTP_CHECK,
        ["--config", '{"headers": {"X-Big": "' + "a" * 9000 + '"}}'],
        "config.headers: value of 'X-Big' is 9,000 characters; at most 8,192 are allowed",
    ),
    (
        HTTP_CHECK,
        ["--config", '{"body_contains": "' + "a" * 9000 + '"}'],
        "config.body_contains: is 9,000 characters long; at most 8,192 are allowed",
    ),
    (HTTP_CHECK, ["--config", DEEP_JSON], "config: is nested more than 32 levels deep"),
    (
        HTTP_CHECK,
        ["--config", '{"max_latency_ms": ' + HUGE_INT + "}"],
        "config: is an integer of 5,000 digits; at most 40 digits are allowed",
    ),
    (
        HTTP_CHECK,
        ["--config", '{"method": "GET", "method": "POST"}'],
        "config: has the key 'method' twice in one object",
    ),
    (
        HTTP_CHECK,
        ["--config", '{"json_path": "a", "json_expected": NaN}'],
        "config.json_expected: must be a finite number",
    ),
    (HTTP_CHECK, ["--period", "99999999999999999999"], "period: must be an integer >= 1"),
    (HTTP_CHECK, ["--region-spread", "1e400"], "region_spread: must satisfy"),
    (
        SCHEDULE.replace("20s", "99999999999999999999d"),
        [],
        "--every: must be a number of seconds or <number><unit>",
    ),
    (SCHEDULE.replace("20s", "400d"), [], "--every: must be from 1 second to 366 days"),
    (SCHEDULE, ["--args", DEEP_JSON], "--args: is nested more than 32 levels deep"),
    (SCHEDULE, ["--args", "[" * 40 + "]" * 40], "--args[0][0][0][0][0][0]...: is nested more"),
    (SCHEDULE, ["--kwargs", '{"n": ' + HUGE_INT + "}"], "--kwargs: is an integer of 5,000"),
    (SCHEDULE, ["--timeout", "1e400"], "--timeout: must be a number of seconds"),
    (
        "schedule add rt1 --task os.system --every 20s",
        [],
        "--task: 'os.system' is not a task this app knows",
    ),
    (
        "schedule add rt1 --task cli_user_tasks.repot --every 20s",
        [],
        "--task: 'cli_user_tasks.repot' is not a task this app knows (did you mean ",
    ),
    ("checks ratelimit acme --per-minute 1e400", [], "per_minute: "),
    ("tenants add acme", ["a b"], "tenant 'a b' is not allowed: use "),
    (
        "checks maintenance add --check web9 --cron 0_3_*_*_*",
        ["--duration", HUGE_INT[:30]],
        "duration: must be whole seconds >= 60",
    ),
    (
        "checks transitions web9 --count 99999999999999999999",
        [],
        "Invalid value for '--count': 99999999999999999999 is not in the range 1<=x<=10000",
    ),
    ("checks transitions --tenant acme --count -1", [], "Invalid value for '--count': -1"),
    ("checks show web9 --results -5", [], "Invalid value for '--results': -5"),
    ("checks add web9 --tenant acme", [], "Missing option '--kind'"),
    ("checks transitions", [], "give a check UID or --tenant"),
    (
        "checks report web9 --from 2026-11-01 --to 2026-12-01 --by year",
        [],
        "by: 'year' is not allowed: use day|week|month",
    ),
    ("checks report --tenant acme --from nope --to 2026-12-01", [], "from: 'nope' is not an ISO"),
    ("checks update web9", [], "nothing to change: pass at least one option"),
    ("checks export -f /nonexistent/dir/x.yaml", [], "/nonexistent/dir/x.yaml: cannot write: "),
    ("checks apply -f /nonexistent/x.yaml", [], "/nonexistent/x.yaml: cannot read: "),
]


@pytest.mark.parametrize(
    ("command", "extra", "expected"), BAD_INPUTS, ids=[e[:40] for _, _, e in BAD_INPUTS]
)
def test_bad_input_is_one_line_naming_the_field_exit_2_and_nothing_written(
    tmp_path, r, command, extra, expected
):
    args = [arg.replace("_", " ") if arg.startswith("0_") else arg for arg in command.split()]
    before = sorted(r.scan_iter())
    done = celery(tmp_path, *args, *extra)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[:2000]
    assert "Traceback" not in output
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Error: {expected}"), line[:500]
    assert len(line) < 400
    assert "t0k3n" not in output  # a header value is never shown
    assert sorted(r.scan_iter()) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["up", "--flower-port", "99999999999"], "checkbeat up: argument --flower-port: must be a "
         "port number 0-65535, got '99999999999'"),
        (["status", "--bogus"], "checkbeat: unrecognized arguments: --bogus"),
    ],
)  # fmt: skip
def test_checkbeat_refuses_a_bad_argument_in_one_line_and_exits_2(tmp_path, args, expected):
    done = run_module("celery_app.cli.main", *args, cwd=tmp_path, pythonpath=[REPO])
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(expected), line
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


BROKEN_SCHEDULE = """
from celery import current_app

current_app.conf.beat_schedule = {
    "as-text": {"task": "proj.x", "schedule": "*/5 * * * *"},
    "fine": {"task": "proj.y", "schedule": 30},
    "an-object": {"task": "proj.x", "schedule": object()},
}
"""


def test_broken_beat_schedule_entries_are_named_one_line_each_by_every_loader(tmp_path, r):
    (tmp_path / "cli_user_tasks.py").write_text(textwrap.dedent(BROKEN_SCHEDULE))
    env = {"CHECKBEAT_IMPORTS": "cli_user_tasks"}
    runs = {
        "schedule list": run_module(
            "celery", "-A", "celery_app", "schedule", "list", cwd=tmp_path,
            pythonpath=[REPO, tmp_path], **env,
        ),
        "status": run_module(
            "celery_app.cli.main", "status", "--data-dir", str(tmp_path), cwd=tmp_path,
            pythonpath=[REPO, tmp_path], **env,
        ),
    }  # fmt: skip
    for name, done in runs.items():
        output = done.stdout + done.stderr
        assert done.returncode == EXIT_CANNOT_RUN, (name, output)
        assert "Traceback" not in output, (name, output)
        lines = done.stderr.splitlines()
        assert len(lines) == 2, (name, lines)
        assert "beat_schedule entry 'as-text': builtins.str is not a schedule" in lines[0]
        assert "beat_schedule entry 'an-object': builtins.object is not a schedule" in lines[1]
