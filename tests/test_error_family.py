"""Every error class of checkbeat derives from CheckbeatError and keeps its builtin base, so
``except CheckbeatError`` catches any of them and ``except ValueError`` what it always caught."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from celery_app.errors import CheckbeatError
from scheduling_core.cron import CronError
from scheduling_core.errors import CheckbeatError as CoreCheckbeatError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduling_core", "celery_app", "beat", "workers")
#: click's exceptions of the CLI: how an error is shown (exit code, one line), not an error kind.
PRESENTATION = {"celery_app.cli.common.CannotRun", "celery_app.cli.common.BadInput"}


def _public_exception_classes() -> list[type[BaseException]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            names = [
                node.name
                for node in tree.body
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
            ]
            if not names:
                continue
            module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module_name = module_name.removesuffix(".__init__")
            module = importlib.import_module(module_name)
            for name in names:
                cls = getattr(module, name)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found.append(cls)
    return found


def test_every_error_class_is_a_checkbeat_error_with_its_builtin_base():
    classes = _public_exception_classes()
    assert len(classes) > 25  # the scan sees the packages' errors
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if not issubclass(cls, CheckbeatError)
        and f"{cls.__module__}.{cls.__qualname__}" not in PRESENTATION
    ]
    assert outside == []
    only_ours = [
        cls.__qualname__
        for cls in classes
        if CheckbeatError in cls.__bases__ and len(cls.__bases__) < 2
    ]
    assert only_ours == [], "keep the builtin base too: class X(CheckbeatError, ValueError)"


def test_the_pure_layer_and_the_app_share_one_base():
    assert CheckbeatError is CoreCheckbeatError
    try:
        raise CronError("minute: 61 is out of range")
    except ValueError as exc:  # what callers caught before still catches it
        assert isinstance(exc, CheckbeatError) and exc.field is None
