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
from support.projects import run_module

from celery_app.cli.common import EXIT_CANNOT_RUN, CannotRun, reported_as_cannot_run
from celery_app.redis.schema import Keys
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
    assert json.loads(as_json.stdout)["problems"]

    register_fake_worker(r, Keys("cbtest"), "w1", region="local", role="shared", concurrency=2)
    healthy = celery(tmp_path, "checks", "diagnose")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "no problems" in healthy.stdout
    healthy_json = celery(tmp_path, "checks", "diagnose", "--json")
    assert healthy_json.returncode == 0, healthy_json.stderr
    assert json.loads(healthy_json.stdout)["problems"] == []


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
