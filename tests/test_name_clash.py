"""A project module named like one of checkbeat's packages is named at start, with what to do.

Each test writes a user's project (``proj``, its own app with ``beat_scheduler =
"beat:CronScheduler"``) to a tmp dir, adds a module of its own named ``beat``, ``workers`` or
``celery_app``, and runs Celery's command line from that directory as a process, as its owner
would: ``python -m celery`` with the project on PYTHONPATH (the project's modules come first), or
the ``celery`` console script (checkbeat's are imported first). What is measured: the exit code
(2), one ``Error:`` line per clash naming the project's file and checkbeat's package, no
traceback; and that a project whose module is never imported under the name runs normally.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis
from support.projects import UserProject

from celery_app.shadowing import ROOT

PROJECT_DB = 7  # a db of the session's server no other test uses

CELERY_PY = """
import os

from celery import Celery

app = Celery("proj", broker=os.environ["PROJ_BROKER_URL"])
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
if os.environ.get("PROJ_INSTALL"):
    from celery_app import install

    install(app)
if os.environ.get("PROJ_IMPORTS"):
    app.conf.imports = os.environ["PROJ_IMPORTS"].split(",")
"""


@pytest.fixture
def project(tmp_path: Path, redis_server) -> UserProject:
    client = redis.Redis.from_url(redis_server.url(PROJECT_DB))
    client.flushdb()
    client.close()
    built = UserProject(tmp_path, redis_server.url(PROJECT_DB), f"clash{uuid.uuid4().hex[:8]}")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "celery.py").write_text(textwrap.dedent(CELERY_PY))
    return built


def _write(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("Error:")]


def _console_script(project: UserProject, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """``celery <args>`` by its console script from the project directory, the project not on
    PYTHONPATH: checkbeat's packages are imported before the project's directory is searched."""
    env = project.env(**extra)
    del env["PYTHONPATH"]
    return subprocess.run(
        [str(Path(sys.executable).parent / "celery"), *args],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_a_projects_beat_module_is_named_by_schedule_list_and_by_beat(project):
    _write(project.root, "beat.py", "NIGHTLY = 3  # the project's own beat settings\n")
    for command in (("schedule", "list"), ("beat", "--pidfile=")):
        result = project.celery(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        (line,) = _error_lines(result)
        assert f"{project.root / 'beat.py'} shadows checkbeat's package 'beat'" in line, line
        assert str(ROOT / "beat") in line and "rename your 'beat'" in line, line


@pytest.mark.parametrize("layout", ["scheduling_core.py", "scheduling_core/__init__.py"])
def test_a_projects_scheduling_core_is_named_by_schedule_list_and_by_beat(project, layout):
    _write(project.root, layout, "RULES = {}  # the project's own scheduling code\n")
    shown = project.root / layout if layout.endswith(".py") and "/" not in layout else None
    for command in (("schedule", "list"), ("beat", "--pidfile=")):
        result = project.celery(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        (line,) = _error_lines(result)
        where = f"{shown}" if shown else f"{project.root / 'scheduling_core'}/"
        assert f"{where} shadows checkbeat's package 'scheduling_core'" in line, line
        assert "rename your 'scheduling_core'" in line, line


def test_a_projects_workers_package_is_named_by_a_worker_with_checkbeats_hooks(project):
    _write(project.root, "workers/__init__.py")
    _write(project.root, "workers/mail.py", "def send(): ...\n")
    result = project.celery("worker", "-P", "solo", "--without-mingle", PROJ_INSTALL="1")
    assert result.returncode == 2, (result.stdout, result.stderr)
    (line,) = _error_lines(result)
    assert f"{project.root / 'workers'}/ shadows checkbeat's package 'workers'" in line, line
    # a plain worker of the same project does not import checkbeat's workers: nothing to refuse
    listed = project.celery("schedule", "list")
    assert listed.returncode == 0, listed.stderr


def test_a_projects_module_in_its_imports_is_named_before_celery_imports_it(project):
    """The console script does not put the project on sys.path, but Celery imports the app's
    ``imports`` from the working directory: a ``beat`` there would replace checkbeat's."""
    _write(project.root, "beat.py")
    for command in (("schedule", "list"), ("beat", "--pidfile=")):
        env = {"PROJ_IMPORTS": "beat"}
        result = _console_script(project, "-A", "proj", *command, **env)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        (line,) = _error_lines(result)
        assert f"{project.root / 'beat.py'} shadows checkbeat's package 'beat'" in line, line


def test_a_projects_celery_app_module_is_named_whichever_is_imported_first(project):
    _write(project.root, "celery_app.py", "from proj.celery import app\n")
    # the project first on sys.path: its celery_app is imported, checkbeat's beat cannot start
    result = project.celery("beat", "--pidfile=", app="celery_app")
    assert result.returncode == 2, (result.stdout, result.stderr)
    (line,) = _error_lines(result)
    assert f"{project.root / 'celery_app.py'} shadows checkbeat's package 'celery_app'" in line
    # the console script: checkbeat's celery_app is imported first (its subcommands are loaded
    # at every start), and `-A celery_app` would run checkbeat's app instead of the project's
    for command in (("schedule", "list"), ("worker", "-P", "solo", "--without-mingle")):
        result = _console_script(project, "-A", "celery_app", *command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        (line,) = _error_lines(result)
        assert f"{project.root / 'celery_app.py'} is shadowed by checkbeat's package" in line
        assert "`-A celery_app` load checkbeat's, not yours" in line, line


def test_a_module_nothing_imports_under_the_name_is_no_clash(project):
    """The console script searches the project directory only while it imports the app: a
    ``beat.py`` there that the app does not import never replaces checkbeat's."""
    _write(project.root, "beat.py")
    result = _console_script(project, "-A", "proj", "schedule", "list")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "shadow" not in result.stderr


def _checkbeat_up(project: UserProject, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "checkbeat"), "up", "--no-view"],
        cwd=project.root,
        env=env or project.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("module", ["workers/__init__.py", "celery_app.py"])
def test_checkbeat_up_names_a_module_its_children_would_import_instead(project, module):
    """``checkbeat up`` starts checkbeat's beat and workers as ``python -m celery`` from the
    working directory: a ``workers`` package on PYTHONPATH, or a ``celery_app.py`` in that
    directory, would replace checkbeat's in every one of them, so ``up`` starts nothing."""
    _write(project.root, module)
    env = project.env()
    if module == "celery_app.py":
        del env["PYTHONPATH"]  # the children find it all the same: `python -m` searches the cwd
    result = _checkbeat_up(project, **env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    name = module.split("/")[0].removesuffix(".py")
    shown = f"{project.root / name}/" if "/" in module else project.root / module
    assert line.startswith(f"checkbeat: {shown} shadows checkbeat's package {name!r}"), line
    assert not (project.root / ".checkbeat").exists()  # nothing started, nothing written
