"""Imports point one way: scheduling_core <- celery_app <- beat, workers (DESIGN.md).

beat and workers never import each other; what they share lives in celery_app. celery_app may
name beat or workers only as import strings in configuration, never in an import statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "scheduling_core": {"celery_app", "beat", "workers", "celery", "kombu", "redis", "httpx"},
    "celery_app": {"beat", "workers"},
    "beat": {"workers"},
    "workers": {"beat"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downwards(package):
    offenders = {}
    for path in sorted((REPO / package).rglob("*.py")):
        bad = _imports(path) & FORBIDDEN[package]
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, f"{package} must not import {sorted(FORBIDDEN[package])}: {offenders}"
