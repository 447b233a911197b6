"""What users install is what the tree holds: the wheel and the sdist, file by file.

Every other test imports the packages from the source tree, where every file is present whatever
pyproject.toml's packaging says; a file the packaging leaves out (a Lua include, a data file) is
missing only for users. So the wheel built from the files git tracks must hold exactly the
tracked files of the four packages (less the commented ``NOT_SHIPPED``), and the sdist must
carry everything that build needs: the wheel pip builds from it is the same.
"""

from __future__ import annotations

import configparser
import subprocess
import tarfile
import tomllib
import zipfile

from support.wheels import (
    NOT_SHIPPED,
    PACKAGES,
    package_files,
    tracked_files,
    wheel_metadata,
    wheel_names,
    wheel_package_files,
)
from support.workers import REPO


def test_the_wheel_holds_every_package_file_git_tracks_and_nothing_else(distributions):
    shipped = wheel_package_files(distributions.wheel)
    expected = package_files()
    assert any(path.endswith(".lua") for path in expected)  # data files, not only modules
    missing, extra = sorted(expected - shipped), sorted(shipped - expected)
    assert not missing, f"tracked, not in the wheel (pyproject.toml's package-data?): {missing}"
    assert not extra, f"in the wheel but not tracked under {PACKAGES}: {extra}"
    top_level = {name.split("/", 1)[0] for name in wheel_names(distributions.wheel)}
    assert top_level - set(PACKAGES) == {distributions.wheel.name.split("-py3")[0] + ".dist-info"}


def test_what_is_not_shipped_is_tracked_and_left_out(distributions):
    # The list stays honest: each entry is a tracked file that the wheel indeed does not hold.
    assert set(tracked_files(PACKAGES)) >= NOT_SHIPPED
    assert not NOT_SHIPPED & wheel_names(distributions.wheel)


def test_the_sdist_carries_what_the_wheel_build_needs(distributions):
    with tarfile.open(distributions.sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}
    assert package_files() <= members, sorted(package_files() - members)
    # pip installing the sdist builds this wheel: the same files with the same bytes.
    from_tree, from_sdist = distributions.wheel, distributions.wheel_from_sdist
    assert from_tree.name == from_sdist.name
    assert wheel_names(from_sdist) == wheel_names(from_tree)
    with zipfile.ZipFile(from_tree) as a, zipfile.ZipFile(from_sdist) as b:
        for name in wheel_package_files(from_tree):
            assert a.read(name) == b.read(name), name


def test_the_wheels_commands_are_pyprojects(distributions):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for wheel in (distributions.wheel, distributions.wheel_from_sdist):
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str  # names are case-sensitive
        entry_points.read_string(wheel_metadata(wheel, "entry_points.txt"))
        assert dict(entry_points["console_scripts"]) == project["scripts"]
        assert dict(entry_points["celery.commands"]) == project["entry-points"]["celery.commands"]
        assert "Provides-Extra: local" in wheel_metadata(wheel, "METADATA")


def test_build_outputs_are_ignored_by_git():
    # `python -m build` or `pip wheel .` in the work tree writes these; none may be committed.
    outputs = ["build/lib/x.py", "dist/checkbeat-0.1.0-py3-none-any.whl", "checkbeat.egg-info/x"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *outputs],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert sorted(ignored.stdout.split()) == sorted(outputs), ignored.stderr
