"""checkbeat's distributions, built the way a user, CI or the Dockerfile gets them.

A build never runs in the work tree: setuptools packs what its ``build/`` directory holds, and a
file left there by an earlier build would hide a file the packaging leaves out. So the files git
tracks (with their working-tree content, so an uncommitted change is what is built) are copied to
a directory of their own first, as a fresh clone has them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from support.workers import REPO

#: The top-level packages the wheel ships (pyproject.toml's ``packages``).
PACKAGES = ("scheduling_core", "celery_app", "beat", "workers")

#: Files git tracks under the packages that the wheel deliberately leaves out, and why.
NOT_SHIPPED = {
    # The workers' documentation, read in the repository (README.md links it); no code reads it.
    "workers/README.md",
}


def tracked_files(under: tuple[str, ...] = ()) -> list[str]:
    """The paths git tracks (under ``under``, if given) that exist in the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *under],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return sorted(path for path in listed if path and (REPO / path).is_file())


def package_files() -> set[str]:
    """What the wheel must hold of the packages: every tracked file but ``NOT_SHIPPED``."""
    return set(tracked_files(PACKAGES)) - NOT_SHIPPED


def copy_files(paths: list[str], dest: Path) -> Path:
    """Copy ``paths`` (relative to the repository) to ``dest``, keeping their layout."""
    for path in paths:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, target)
    return dest


def build(srcdir: Path, outdir: Path, *dists: str) -> list[Path]:
    """``python -m build [--sdist] [--wheel] --outdir outdir srcdir`` in an isolated build
    environment (setuptools from the index, as pip gets it); the files it made."""
    before = set(outdir.glob("*")) if outdir.exists() else set()
    done = subprocess.run(
        [sys.executable, "-m", "build", *dists, "--outdir", str(outdir), str(srcdir)],
        cwd=srcdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout}\n{done.stderr}"
    return sorted(set(outdir.glob("*")) - before)


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    """The sdist's source directory, unpacked in ``dest``."""
    with tarfile.open(sdist) as archive:
        archive.extractall(dest, filter="data")
    (top,) = dest.iterdir()
    return top


def wheel_names(wheel: Path) -> set[str]:
    """Every file of the wheel (directories are not entries of a wheel)."""
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if not name.endswith("/")}


def wheel_package_files(wheel: Path) -> set[str]:
    """The wheel's files, less its ``.dist-info`` metadata."""
    return {name for name in wheel_names(wheel) if ".dist-info/" not in name}


def wheel_metadata(wheel: Path, name: str) -> str:
    """A file of the wheel's ``.dist-info`` (``entry_points.txt``, ``METADATA``, ...)."""
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
        return archive.read(path).decode()
