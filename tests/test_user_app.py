"""checkbeat in a Celery project of the user's own: ``celery -A proj ...`` as subprocesses.

The projects live in tests/user_project and are copied to a tmp dir, which is the cwd and on
PYTHONPATH, as a user's project would be: ``proj`` calls ``celery_app.install(app)`` and sets
``app.conf.checkbeat_*``; ``plain`` sets only ``beat_scheduler``. No ``CHECKBEAT_*`` variable
reaches them unless a test sets one, and their state shares their broker's db (no Redis URL is
given), so the keys found there show which prefix won.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.polling import wait_for
from support.projects import UserProject, stop

from celery_app.cron_tasks.registration import GLOBAL_TENANT
from celery_app.redis.schema import Keys
from celery_app.wall_clock import TEST_CLOCK_ENV, Clock

PROJECTS = Path(__file__).resolve().parent / "user_project"
#: A db of the session's server that no other test uses: the projects' broker and state.
PROJECT_DB = 5


@pytest.fixture
def project(tmp_path: Path, redis_server, project_db) -> Project:
    for name in ("proj", "plain"):
        shutil.copytree(PROJECTS / name, tmp_path / name)
    return Project(tmp_path, redis_server.url(PROJECT_DB), f"proj{uuid.uuid4().hex[:8]}")


class Project(UserProject):
    """The copied projects (``proj`` by default, ``plain`` with ``app="plain"``)."""

    def __init__(self, root: Path, broker_url: str, prefix: str) -> None:
        super().__init__(root, broker_url, prefix)
        self.keys = Keys(prefix)

    def add_conf(self, line: str, app: str = "proj") -> None:
        with open(self.root / app / "celery.py", "a") as module:
            module.write(f"{line}\n")


def test_schedule_list_shows_the_projects_cron_task_in_its_timezone(project):
    listed = project.celery("schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"proj-nightly"}
    assert rows["proj-nightly"]["source"] == "@cron"
    assert rows["proj-nightly"]["timezone"] == "Europe/Berlin"  # app.conf.timezone
    assert datetime.fromisoformat(rows["proj-nightly"]["next_fire"]).hour in (2, 3)  # 03:00 CE(S)T
    table = project.celery("schedule", "list")
    assert table.returncode == 0 and "proj-nightly" in table.stdout


def test_run_now_is_executed_and_recorded_by_the_projects_worker(project, project_db):
    worker = project.start("worker", "-P", "solo", "-Q", "celery", "--without-mingle", "-l", "INFO")
    try:
        done = project.celery("schedule", "run", "proj-nightly", "--wait")
        assert done.returncode == 0, done.stdout + done.stderr + project.logs()
        assert "outcome: success" in done.stdout
    finally:
        stop(worker)
    rows = json.loads(project.celery("schedule", "list", "--json").stdout)
    assert rows[0]["last_outcome"] == "success"
    state = project_db.hgetall(project.keys.cron_state("proj-nightly", GLOBAL_TENANT))
    assert state["outcome"] == "success", state
    assert "[tasks]" in project.logs() and "checkbeat.run_check" in project.logs()


def test_tenants_and_checks_with_the_projects_own_kind(project, project_db):
    added = project.celery("tenants", "add", "acme", "globex")
    assert added.returncode == 0, added.stderr
    assert project.celery("tenants", "list").stdout.split() == ["acme", "globex"]
    assert project_db.smembers(project.keys.tenants()) == {"acme", "globex"}

    created = project.celery(
        "checks", "add", "c1", "--tenant", "acme", "--kind", "proj-local",
        "--target", "local:one", "--period", "30",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    refused = project.celery(
        "checks", "add", "c2", "--tenant", "acme", "--kind", "proj-local",
        "--target", "remote", "--period", "30",
    )  # fmt: skip
    assert refused.returncode != 0 and "must start with 'local:'" in refused.stderr
    listed = json.loads(project.celery("checks", "list", "--json").stdout)
    assert [c["uid"] for c in listed] == ["c1"]
    # The first of app.conf.checkbeat_regions is the default region of a new check.
    assert project_db.exists(project.keys.job("c1@eu"))


def test_diagnose_exit_codes(project, project_db):
    no_beat = project.celery("schedule", "diagnose")
    assert no_beat.returncode == 1 and "no live beat" in no_beat.stdout
    project_db.hset(project.keys.beat_heartbeat(), "beat-x", time.time())
    healthy = project.celery("schedule", "diagnose")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr


def test_the_environment_overrides_the_apps_conf(project, project_db):
    env_prefix = f"{project.prefix}env"
    added = project.celery("tenants", "add", "acme", CHECKBEAT_KEY_PREFIX=env_prefix)
    assert added.returncode == 0, added.stderr
    assert project_db.smembers(Keys(env_prefix).tenants()) == {"acme"}
    assert not project_db.exists(project.keys.tenants())  # app.conf.checkbeat_key_prefix lost


def test_a_misspelt_conf_key_is_refused_naming_it_and_its_close_match(project):
    project.add_conf("app.conf.checkbeat_pool_sise = 4")
    for command in (("schedule", "list"), ("tenants", "list")):
        refused = project.celery(*command)
        assert refused.returncode == 2, refused.stderr
        assert "app.conf.checkbeat_pool_sise: not a checkbeat setting" in refused.stderr
        assert "did you mean checkbeat_pool_size?" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_a_bad_value_is_refused_naming_the_key_as_the_user_wrote_it(project):
    project.add_conf("app.conf.checkbeat_pool_size = 0")
    by_conf = project.celery("schedule", "list")
    assert by_conf.returncode == 2, by_conf.stderr
    assert "app.conf.checkbeat_pool_size=0: must be an integer >= 1" in by_conf.stderr
    by_env = project.celery("schedule", "list", CHECKBEAT_POOL_SIZE="-3")
    assert by_env.returncode != 0
    assert "CHECKBEAT_POOL_SIZE='-3': must be an integer >= 1" in by_env.stderr
    assert "app.conf.checkbeat_pool_size" not in by_env.stderr  # the environment's value won


def test_a_worker_of_a_misconfigured_project_exits_with_the_message(project):
    project.add_conf("app.conf.checkbeat_regions = ['eu', 'e u']")
    worker = project.celery("worker", "-P", "solo", "--role", "fast")
    assert worker.returncode != 0
    assert "app.conf.checkbeat_regions=" in worker.stdout + worker.stderr
    assert "region 'e u' may contain only" in worker.stdout + worker.stderr
    assert "Traceback" not in worker.stdout + worker.stderr


def test_beat_scheduler_alone_fires_and_records_cron_tasks(project, project_db):
    """``plain`` never calls install: its beat fires the window, its worker records the run."""
    now = datetime.now(UTC)
    window = (now + timedelta(minutes=1)).replace(second=0, microsecond=0)
    # beat starts (imports included) before the window: a first deployment fires the first
    # window that starts after beat saw the task
    clock = Clock(start=window - timedelta(seconds=15), epoch=time.time(), rate=1.0)
    env = {TEST_CLOCK_ENV: clock.encode()}
    worker = project.start("worker", "-P", "solo", "--without-mingle", app="plain", **env)
    beat = project.start("beat", "--pidfile=", app="plain", **env)
    try:
        state_key = project.keys.cron_state("plain-minute", GLOBAL_TENANT)
        wait_for(
            lambda: project_db.hget(state_key, "outcome") == "success",
            timeout=60,
            what=lambda: f"plain-minute recorded as run\n{project.logs()}",
        )
    finally:
        stop(beat)
        stop(worker)
    assert project_db.hget(state_key, "last_end")
