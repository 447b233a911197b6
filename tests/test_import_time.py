"""No work at import: importing checkbeat builds no Celery app and imports no user module.

Each case runs in a fresh interpreter, since this test session has long since built apps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDER = "import_recorder"


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CHECKBEAT_IMPORTS"}
    environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), **env)
    return subprocess.run(
        args, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60
    )


def test_importing_the_packages_with_a_bad_setting_succeeds(tmp_path):
    done = _run(
        [sys.executable, "-c", "import celery_app, beat, workers, scheduling_core"],
        tmp_path,
        CHECKBEAT_POOL_SIZE="0",
    )
    assert done.returncode == 0, done.stderr


def test_no_module_builds_an_app_or_imports_a_user_module_until_the_app_is_used(tmp_path):
    """Every module of celery_app, beat and workers imports without building an app or
    importing CHECKBEAT_IMPORTS; ``celery_app.app`` then builds one app and imports them."""
    (tmp_path / f"{RECORDER}.py").write_text("IMPORTED = True\n")
    script = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        from celery import _state

        import celery_app, beat, workers

        names = []
        for package in (celery_app, beat, workers):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                if not info.name.endswith("__main__"):
                    importlib.import_module(info.name)
                    names.append(info.name)
        assert "celery_app.local.bootstrap" in names and "workers.tasks" in names, names
        assert {RECORDER!r} not in sys.modules, "user module imported at import time"
        assert list(_state._apps) == [], f"apps built at import: {{list(_state._apps)}}"
        assert "app" not in vars(celery_app)

        app = celery_app.app
        assert {RECORDER!r} in sys.modules, "user module not imported by the app"
        assert list(_state._apps) == [app]
        assert celery_app.app is app
        print("ok", len(names))
        """
    )
    done = _run([sys.executable, "-c", script], tmp_path, CHECKBEAT_IMPORTS=RECORDER)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


@pytest.mark.parametrize("command", [["schedule", "list"], ["worker", "--pool=solo"]])
def test_a_bad_setting_fails_the_celery_command_in_one_line(tmp_path, command):
    done = _run(
        [sys.executable, "-m", "celery", "-A", "celery_app", *command],
        tmp_path,
        CHECKBEAT_POOL_SIZE="0",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    naming = [line for line in output.splitlines() if "CHECKBEAT_POOL_SIZE" in line]
    assert naming == ["  CHECKBEAT_POOL_SIZE='0': must be an integer >= 1 and <= 10,000"], output
    assert output.startswith("Error: invalid checkbeat configuration"), output


def test_outside_celerys_cli_a_bad_setting_is_an_exception_naming_it(tmp_path):
    script = textwrap.dedent(
        """
        import celery_app
        from celery_app.settings import SettingsError

        try:
            celery_app.app
        except SettingsError as exc:
            print(exc)
        else:
            raise AssertionError("the app was built from a bad setting")
        """
    )
    done = _run([sys.executable, "-c", script], tmp_path, CHECKBEAT_POOL_SIZE="0")
    assert done.returncode == 0, done.stderr
    assert "CHECKBEAT_POOL_SIZE='0': must be an integer >= 1 and <= 10,000" in done.stdout
