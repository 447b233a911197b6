"""The Dockerfile compose.yaml builds: no Docker engine runs here, so the file is parsed, and the
wheel its build stage makes is built the same way, from the same files, and compared with the tree.

What it must hold: the final stage installs only the wheel of the build stage (with the
``local`` extra, as compose's Flower needs) and no source, so the image runs what a user's
``pip install`` gets, and a file the packaging leaves out is missing from the image too.
"""

from __future__ import annotations

import fnmatch
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from support.wheels import build, package_files, tracked_files, wheel_package_files
from support.workers import REPO

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    #: (instruction, arguments) in order, continuation lines joined.
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def workdir(self) -> PurePosixPath:
        (workdir,) = self.all("WORKDIR")
        return PurePosixPath(workdir)


def stages() -> list[Stage]:
    """The Dockerfile's stages (comments dropped, ``\\`` continuations joined)."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            logical.append(" ".join(current.split()))
            current = ""
    found: list[Stage] = []
    for text in logical:
        instruction, _, args = text.partition(" ")
        if instruction.upper() == "FROM":
            base, _, name = args.partition(" AS ")
            found.append(Stage(base.strip(), name.strip() or None))
        else:
            found[-1].instructions.append((instruction.upper(), args))
    return found


def copies(stage: Stage) -> list[tuple[str | None, list[str], str]]:
    """Each COPY of ``stage`` as (its --from stage or None, sources, destination)."""
    result = []
    for args in stage.all("COPY"):
        words = shlex.split(args)
        source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        paths = [w for w in words if not w.startswith("--")]
        result.append((source_stage, paths[:-1], paths[-1]))
    return result


def build_command(stage: Stage) -> list[str]:
    """The ``python -m build ...`` of the build stage's RUN lines."""
    for run in stage.all("RUN"):
        for command in run.split("&&"):
            words = shlex.split(command)
            if words[:3] == ["python", "-m", "build"]:
                return words[3:]
    raise AssertionError("the build stage runs no `python -m build`")


def test_two_stages_and_the_final_one_holds_no_source():
    builder, final = stages()
    assert builder.name == "build" and final.name is None
    assert builder.base == final.base  # the wheel is built by the Python that runs it
    for source_stage, _sources, _dest in copies(final):
        assert source_stage == builder.name, "the final stage copies only the build stage's wheel"


def test_the_final_stage_installs_the_build_stages_wheel_with_the_local_extra():
    builder, final = stages()
    ((_from, (wheels,), dest),) = copies(final)
    outdir = build_command(builder)[build_command(builder).index("--outdir") + 1]
    assert PurePosixPath(wheels).parent == PurePosixPath(outdir) and wheels.endswith("*.whl")
    (run,) = final.all("RUN")
    commands = [shlex.split(c) for c in run.split("&&")]
    glob = next(words[2] for words in commands if words[:2] == ["set", "--"])
    assert PurePosixPath(glob).parent == PurePosixPath(dest)
    install = next(words for words in commands if words[:2] == ["pip", "install"])
    assert install[-1] == "$1[local]"  # the wheel `set --` found, with the extra
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "local" in extras["optional-dependencies"]
    # No source, so `celery -A celery_app` in WORKDIR imports the installed packages.
    assert not [d for _f, _s, d in copies(final) if PurePosixPath(d).is_relative_to("/app")]
    assert final.all("USER") == ["checkbeat"]


def docker_copy(sources: list[str], dest: str, workdir: Path) -> None:
    """``COPY <sources> <dest>`` from the build context (the files git tracks in the repository:
    a fresh clone's) into ``workdir``: a directory's contents go into ``dest``, a file into
    ``dest/`` when it ends with ``/``."""
    for source in sources:
        for path in tracked_files((source,)):
            if (REPO / source).is_dir():
                target = workdir / dest / Path(path).relative_to(source)
            elif dest.endswith("/"):
                target = workdir / dest / Path(path).name
            else:
                target = workdir / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, target)


def test_the_build_stage_builds_the_wheel_of_the_tree(tmp_path: Path):
    builder, final = stages()
    workdir = tmp_path / "src"
    for source_stage, sources, dest in copies(builder):
        assert source_stage is None
        docker_copy(sources, dest, workdir)
    args = build_command(builder)
    at = args.index("--outdir")
    assert args[at + 2 :] == [], "the build stage builds its WORKDIR"
    made = build(workdir, tmp_path / "dist", *args[:at])
    # One wheel: the one the final stage copies and then installs.
    (wheel,) = [p for p in made if p.suffix == ".whl"]
    ((_from, (copied,), _dest),) = copies(final)
    (run,) = final.all("RUN")
    glob = next(shlex.split(c)[2] for c in run.split("&&") if shlex.split(c)[:2] == ["set", "--"])
    assert fnmatch.fnmatch(wheel.name, PurePosixPath(copied).name)
    assert fnmatch.fnmatch(wheel.name, PurePosixPath(glob).name)
    # It holds the tree's package files, every one (test_wheel.py's list), and nothing else.
    shipped, expected = wheel_package_files(wheel), package_files()
    assert shipped == expected, (sorted(expected - shipped), sorted(shipped - expected))
