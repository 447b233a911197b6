"""Fixtures of the packaging tests: the sdist and wheels built once per session from the files
git tracks, and a fresh virtualenv outside the source tree with the wheel installed.

Helpers (the builds, the file lists) are in :mod:`support.wheels`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.wheels import build, copy_files, tracked_files, unpack_sdist


@dataclass(frozen=True)
class Distributions:
    sdist: Path
    #: The wheel built from the tree's files.
    wheel: Path
    #: The wheel built from the unpacked sdist (what pip builds when it installs the sdist).
    wheel_from_sdist: Path


@dataclass(frozen=True)
class WheelVenv:
    root: Path
    python: Path
    bin: Path
    site_packages: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of the venv's processes: no ``PYTHONPATH`` (the repository must not
        be importable), no ``CHECKBEAT_*`` of the suite, the venv's ``bin`` first on ``PATH``."""
        environ = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("CHECKBEAT_")
        }
        environ["PATH"] = os.pathsep.join([str(self.bin), environ.get("PATH", "")])
        environ["PYTHONUNBUFFERED"] = "1"
        environ.update(extra)
        return environ


@pytest.fixture(scope="session")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> Distributions:
    """The sdist and the wheel built from the tracked tree, and the wheel built from that sdist."""
    root = tmp_path_factory.mktemp("dists")
    source = copy_files(tracked_files(), root / "tree")
    made = build(source, root / "out", "--sdist", "--wheel")
    (sdist,) = [p for p in made if p.name.endswith(".tar.gz")]
    (wheel,) = [p for p in made if p.suffix == ".whl"]
    unpacked = unpack_sdist(sdist, root / "sdist")
    (wheel_from_sdist,) = build(unpacked, root / "from-sdist", "--wheel")
    return Distributions(sdist, wheel, wheel_from_sdist)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, distributions: Distributions) -> WheelVenv:
    """A new virtualenv in a tmp dir with ``checkbeat[local]`` installed from the wheel (its
    dependencies from the index, as a user's ``pip install`` gets them)."""
    root = tmp_path_factory.mktemp("wheel-venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], cwd=root, check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{distributions.wheel}[local]"],
        cwd=root,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return WheelVenv(root=venv, python=python, bin=venv / "bin", site_packages=Path(site))
