"""checkbeat run from the wheel a user installs, in a new virtualenv outside the source tree.

Every other test imports the packages from the tree. Here the wheel (built once per session,
``wheel_fixtures``) is installed with its ``local`` extra into a virtualenv in a tmp dir, and
a user's project (tests/wheel_project, copied to a tmp dir that is the cwd) runs with only that
virtualenv and the project importable: a real beat and worker on the session's redis-server, an
http check against a real server on 127.0.0.1 going up and then down, the transition delivered
to the project's ``@on_transition`` hook, its ``beat_schedule`` entry and its ``@cron`` task
firing and running; then ``checkbeat up --demo`` from the same virtualenv.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support.flip_server import FlipServer
from support.polling import wait_for
from support.projects import InstalledProject
from support.workers import REPO

from celery_app.checks.jobs import read_job
from celery_app.redis.schema import Keys

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parent / "wheel_project"
#: A db of the session's server that no other test uses: the project's broker and state.
PROJECT_DB = 7
#: What the project's tasks and hook append to (tests/wheel_project/proj/tasks.py).
PINGS, MINUTES, TRANSITIONS = "proj:pings", "proj:minutes", "proj:transitions"
#: A log line of level WARNING or above, in Celery's format (``[... WARNING/MainProcess] ...``).
WARNING_LINE = re.compile(r"\b(WARNING|ERROR|CRITICAL)/|Traceback")
LUA_NOT_LOADED = "could not load the Lua scripts"


def outside_the_tree(path: Path) -> bool:
    return path.resolve() != REPO and REPO not in path.resolve().parents


def processes_under(root: Path) -> list[int]:
    """The processes whose program lies under ``root`` (the venv's python, its redis-server)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            program = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and program.startswith(f"{root}/"):
            found.append(int(proc.name))
    return found


def records(client: redis.Redis, key: str) -> list[dict]:
    return [json.loads(item) for item in client.lrange(key, 0, -1)]


def waited(predicate, timeout: float, what: str, logs) -> object:
    """``wait_for`` that shows ``logs()`` as they are when it times out."""
    try:
        return wait_for(predicate, timeout, interval=0.1, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None


@pytest.fixture
def project(tmp_path: Path, redis_server, project_db, wheel_venv) -> Iterator[InstalledProject]:
    """tests/wheel_project in a tmp dir, run by the wheel's virtualenv."""
    assert outside_the_tree(tmp_path) and outside_the_tree(wheel_venv.root)
    shutil.copytree(PROJECT / "proj", tmp_path / "proj")
    installed = InstalledProject(
        tmp_path,
        redis_server.url(PROJECT_DB),
        f"wheel{uuid.uuid4().hex[:8]}",
        python=wheel_venv.python,
        base=wheel_venv.env(),
    )
    yield installed
    installed.stop_all()


def test_the_installed_packages_are_the_venvs_not_the_trees(project, wheel_venv):
    probe = (
        "import json, sys, beat, celery_app, scheduling_core, workers; "
        "print(json.dumps({'files': [m.__file__ for m in (beat, celery_app, scheduling_core, "
        "workers)], 'path': sys.path}))"
    )
    done = subprocess.run(
        [str(wheel_venv.python), "-c", probe],
        cwd=project.root,
        env=project.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for file in found["files"]:
        assert Path(file).is_relative_to(wheel_venv.site_packages), file
    # "" is the cwd, the project's directory
    assert all(outside_the_tree(project.root / entry) for entry in found["path"]), found["path"]


def test_a_project_runs_checks_transitions_and_cron_tasks_from_the_wheel(
    project, project_db, wheel_venv
):
    keys, db, logs = Keys(project.prefix), project_db, project.logs
    site_packages = wheel_venv.site_packages
    beat = project.start("beat", "-l", "INFO")
    beat_log = project.root / "beat-0.log"
    # Its start-up (the scheduler loaded, the Lua scripts with it, the first tick) logs no warning.
    waited(lambda: "cron: fired" in beat_log.read_text(), 60, "beat's first tick", logs)
    startup = beat_log.read_text()
    assert not [line for line in startup.splitlines() if WARNING_LINE.search(line)], startup
    worker = project.start(
        "worker", "-P", "threads", "-c", "4", "-Q", "checks.eu.fast,checks.eu.slow,celery",
        "-n", "wheel@%h", "-l", "INFO",
    )  # fmt: skip
    with FlipServer() as target:
        added = project.celery(
            "checks", "add", "web", "--tenant", "acme", "--kind", "http",
            "--target", f"{target.url}/web", "--period", "1",
            "--failure-threshold", "1", "--success-threshold", "1",
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr

        def last_status() -> str | None:
            last = db.hget(keys.last_result("web"), "eu")
            return json.loads(last)["status"] if last else None

        def runs() -> int:
            job = read_job(db, keys, "web@eu")
            return job.runs if job else 0

        # A run completes (complete.lua and its includes, from the wheel) and is up.
        waited(lambda: runs() >= 2 and last_status() == "up", 90, "completed up runs", logs)
        target.fail("web")
        waited(lambda: db.hget(keys.check_state("web"), "s") == "down", 30, "down", logs)
        delivered = waited(lambda: records(db, TRANSITIONS), 30, "the hook's record", logs)
        assert [(t["uid"], t["from_state"], t["to_state"]) for t in delivered] == [
            ("web", "up", "down")
        ]
        assert Path(delivered[0]["checkbeat"]).is_relative_to(site_packages)
        # `checks show` reads it back now: the check keeps running every second, and the
        # results it shows are the latest ones.
        shown = project.celery("checks", "show", "web", "--json")
        assert shown.returncode == 0, shown.stderr
        state = json.loads(shown.stdout)
        assert state["state"]["state"] == "down"
        assert [(t["from"], t["to"]) for t in state["transitions"]] == [("up", "down")]
        assert {r["result"]["status"] for r in state["results"]} >= {"up", "down"}

    # The beat_schedule entry (every 2 s) and the @cron task (every minute) fired and ran.
    waited(lambda: records(db, PINGS), 30, "a beat_schedule run", logs)
    waited(lambda: records(db, MINUTES), 75, "the @cron task's run", logs)
    assert Path(records(db, MINUTES)[0]["checkbeat"]).is_relative_to(site_packages)

    # The installed commands read it back.
    listed = project.celery("schedule", "list", "--json")
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows["proj-minute"]["last_outcome"] == "success", rows

    assert beat.poll() is None and worker.poll() is None
    project.stop_all()
    # Then nothing else warned either: the check's runs, its transition, the stop.
    whole = beat_log.read_text()
    assert "scheduler -> beat.scheduler.CronScheduler" in whole, whole
    assert not [line for line in whole.splitlines() if WARNING_LINE.search(line)], whole
    assert LUA_NOT_LOADED not in project.logs()


def test_checkbeat_up_demo_comes_up_from_the_wheel_and_stops_on_ctrl_c(wheel_venv, tmp_path):
    data_dir, out_file = tmp_path / "cb", tmp_path / "up.out"

    def checkbeat(*args: str, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
        argv = [str(wheel_venv.bin / "checkbeat"), *args, "--data-dir", str(data_dir)]
        common = {"cwd": tmp_path, "env": wheel_venv.env(), "text": True}
        if kwargs.pop("background", False):
            return subprocess.Popen(argv, **common, **kwargs)
        return subprocess.run(argv, **common, capture_output=True, timeout=60)

    with out_file.open("w") as out:
        up = checkbeat(
            "up", "--demo", "--no-view", "--flower-port", "0",
            background=True, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:

        def a_check_is_up():
            if not (data_dir / "env.json").exists():
                return None
            status = checkbeat("status", "--json")
            if status.returncode != 0:
                return None
            checks = json.loads(status.stdout)["checks"]
            return [c for c in checks if c["last_status"] == "up"] or None

        waited(a_check_is_up, 150, "a demo check up", out_file.read_text)
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0, out_file.read_text()
        assert not processes_under(wheel_venv.root), "up left children behind"
    finally:
        if up.poll() is None:  # a failure above: Ctrl-C stops the children in order
            up.send_signal(signal.SIGINT)
            try:
                up.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(30)
        # Each child runs in a session of its own: any still alive is killed by its pid.
        for pid in processes_under(wheel_venv.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    output = out_file.read_text()
    assert "stopping beat" in output
    logs = {log.name: log.read_text(errors="replace") for log in (data_dir / "logs").glob("*.log")}
    assert "beat.log" in logs, sorted(logs)
    assert not [name for name, text in logs.items() if LUA_NOT_LOADED in text]
    assert LUA_NOT_LOADED not in output
