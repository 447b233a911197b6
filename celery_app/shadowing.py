"""checkbeat's top-level package names, and a project module of the same name.

checkbeat is four top-level packages: ``celery_app``, ``beat``, ``workers`` and
``scheduling_core``, names a Celery project may well use itself (``celery_app.py`` for its app,
``beat.py``, a ``workers/`` package). Python keeps one module per name: whichever was imported
first, else whichever comes first on ``sys.path``, and Celery puts the working directory first
while it imports the ``-A`` app and its ``imports`` (as ``python -m`` and ``PYTHONPATH=.`` do for
the whole process). So either the project's module shadows checkbeat's, and checkbeat fails later
with an import error naming neither (``beat:CronScheduler`` has no ``CronScheduler``, ``No module
named 'workers.probes'``), or checkbeat's shadows the project's, and ``-A celery_app`` silently
loads checkbeat's app instead of the project's. :func:`clashes` finds both at start, for the
names the process needs, and :class:`NameClash` says in one line which file is taken for which
and what to do. Nothing here imports a module: it reads ``sys.modules`` and asks the import
system where a name would be found.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery.utils.imports import cwd_in_path

#: checkbeat's top-level packages (pyproject.toml's package list).
PACKAGES = ("celery_app", "beat", "workers", "scheduling_core")
#: The directory holding checkbeat's packages (site-packages, or the source tree of an editable
#: install): every one of them is a directory here with an ``__init__.py``.
ROOT = Path(__file__).resolve().parents[1]
#: The ``beat_scheduler`` values that name checkbeat's scheduler.
CRON_SCHEDULERS = frozenset(
    {"beat:CronScheduler", "beat.CronScheduler", "beat.scheduler:CronScheduler",
     "beat.scheduler.CronScheduler"}
)  # fmt: skip


@dataclass(frozen=True)
class NameClash:
    """A module of the project and a package of checkbeat share the top-level ``name``.

    ``theirs`` is the project's file (or package directory); ``ours_wins``: checkbeat's package is
    the one imported, so the project's own imports of ``name`` get checkbeat's.
    """

    name: str
    theirs: str
    ours_wins: bool

    @property
    def ours(self) -> str:
        return f"{ROOT / self.name}{os.sep}"

    def __str__(self) -> str:
        rename = (
            f"rename your {self.name!r} (checkbeat's top-level packages are "
            f"{', '.join(PACKAGES)}) and import it by the new name"
        )
        if self.ours_wins:
            return (
                f"{self.theirs} is shadowed by checkbeat's package {self.name!r} ({self.ours}): "
                f"`import {self.name}` and `-A {self.name}` load checkbeat's, not yours; {rename}"
            )
        return (
            f"{self.theirs} shadows checkbeat's package {self.name!r} ({self.ours}): "
            f"`import {self.name}` loads yours, so checkbeat cannot start; {rename}, "
            "or take its directory off sys.path (PYTHONPATH)"
        )


def _ours(name: str) -> Path:
    return ROOT / name / "__init__.py"


def _location(module: Any) -> str | None:
    """Where a module was loaded from: its file, or its package directory (a namespace
    package's first one)."""
    file = getattr(module, "__file__", None)
    if file:
        return file
    paths = list(getattr(module, "__path__", None) or ())
    return paths[0] if paths else None


def _found(name: str) -> str | None:
    """Where ``import name`` would load from now (without importing it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.has_location:
        return spec.origin
    locations = list(spec.submodule_search_locations or ())
    return locations[0] if locations else None


def _is_ours(location: str, name: str) -> bool:
    try:
        return Path(location).resolve() == _ours(name).resolve()
    except OSError:
        return False


def _shown(location: str) -> str:
    """A package as its directory (``/proj/workers/``), a module as its file."""
    path = Path(location)
    if path.name == "__init__.py":
        return f"{path.parent}{os.sep}"
    return str(path) if path.suffix else f"{path}{os.sep}"


def _in_directory(name: str, directory: Path) -> str | None:
    """The module ``name`` a directory holds (``name.py`` or a regular package), if any."""
    for candidate in (directory / f"{name}.py", directory / name / "__init__.py"):
        if candidate.is_file():
            return str(candidate)
    return None


def clashes(
    names: Iterable[str],
    *,
    cwd_imports: Iterable[str] = (),
    celery_cwd: bool = False,
    cwd_first: bool = False,
) -> list[NameClash]:
    """The clashes, among ``names`` (checkbeat's packages this process needs), between
    checkbeat's package and a module of the same name, one per name.

    A name clashes when the module imported under it, or else the one ``import`` would find now,
    is not checkbeat's. ``cwd_imports``: names Celery will import with the working directory
    first on sys.path (the top-level names of the app's ``imports`` and ``include``), looked up
    that way. ``celery_cwd``: the process is Celery's command line, which imports the project from
    the working directory; a module there named like a checkbeat package that is already
    imported is a clash too (the project's imports of it get checkbeat's). ``cwd_first``: the
    processes that will import these names have the working directory first on sys.path
    (``python -m celery`` children), so a module there wins.
    """
    found: list[NameClash] = []
    cwd_names = set(cwd_imports)
    try:
        cwd = Path.cwd()
    except OSError:
        cwd, celery_cwd, cwd_first = None, False, False
    for name in dict.fromkeys(names):
        if cwd_first and cwd is not None:
            theirs = _in_directory(name, cwd)
            if theirs is not None and not _is_ours(theirs, name):
                found.append(NameClash(name, _shown(theirs), ours_wins=False))
                continue
        module = sys.modules.get(name)
        if module is not None:
            location = _location(module)
        elif name in cwd_names:
            with cwd_in_path():
                location = _found(name)
        else:
            location = _found(name)
        if location is None:
            continue
        if not _is_ours(location, name):
            found.append(NameClash(name, _shown(location), ours_wins=False))
            continue
        if module is not None and celery_cwd and cwd is not None:
            theirs = _in_directory(name, cwd)
            if theirs is not None and not _is_ours(theirs, name):
                found.append(NameClash(name, _shown(theirs), ours_wins=True))
    return found


def uses_cron_scheduler(app: Any) -> bool:
    """Whether the app's beat runs checkbeat's ``CronScheduler``."""
    scheduler = app.conf.beat_scheduler
    if isinstance(scheduler, str):
        return scheduler in CRON_SCHEDULERS
    return getattr(scheduler, "__module__", "") == "beat.scheduler"


def needed_by(app: Any, *, runs_beat: bool) -> list[str]:
    """checkbeat's packages a process of ``app`` imports: ``celery_app`` and
    ``scheduling_core`` always, ``workers`` where the app imports checkbeat's worker modules
    (``install(app)``, checkbeat's own app), ``beat`` where it runs checkbeat's scheduler."""
    from celery_app.factory import runs_checkbeat_tasks

    names = ["celery_app", "scheduling_core"]
    if runs_checkbeat_tasks(app):
        names.append("workers")
    if runs_beat and uses_cron_scheduler(app):
        names.append("beat")
    return names


def app_clashes(app: Any, *, runs_beat: bool) -> list[NameClash]:
    """:func:`clashes` for a process of ``app`` under Celery's command line."""
    from celery_app.factory import app_modules

    cwd_imports = [m.split(".", 1)[0] for m in app_modules(app)]
    return clashes(
        needed_by(app, runs_beat=runs_beat),
        cwd_imports=[n for n in cwd_imports if n in PACKAGES],
        celery_cwd=True,
    )
