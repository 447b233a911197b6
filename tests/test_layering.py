"""Imports point one way (docs/architecture.md):

    scheduling_core <- foundation <- redis <- app <- cron_tasks | checks
        <- beat | workers | cli | local

- scheduling_core is pure: no checkbeat module, no celery, kombu, redis or httpx.
- foundation (``celery_app.settings``, ``clock``, ``errors``, ``names``) knows no Redis or Celery
  state; ``celery_app.redis`` (client, TLS, schema, scripts) knows no cron task or check.
- app (``celery_app.factory``, ``publish``, ``registry``, ``worker_options``) builds and serves
  the Celery app; ``cron_tasks`` and ``checks`` are siblings that never import each other.
- ``celery_app.metrics`` (the Prometheus series, their server) sits beside app: it knows settings
  and the schema only, so ``cron_tasks`` and ``checks`` may record into it.
- the edges (``beat``, ``workers``, ``celery_app.cli``, ``celery_app.local`` and the package's
  public ``celery_app/__init__``) use everything below; beat and workers never import each
  other, and nothing below the edges names beat or workers except as an import string.

Imports under ``if TYPE_CHECKING:`` are annotations, not dependencies, and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduling_core", "celery_app", "beat", "workers")
FOUNDATION = {"settings", "clock", "errors", "names", "cluster_url", "input_limits"}
APP = {"factory", "publish", "registry", "worker_options"}
RANK = {
    "core": 0,
    "foundation": 1,
    "redis": 2,
    "app": 3,
    "metrics": 3,
    "cron_tasks": 4,
    "checks": 4,
}
EDGE_RANK = 5
#: Edge-to-edge imports that are allowed: the console script starts the local system, and the
#: local demo declares its cron task through the public API.
EDGE_EDGES = {("cli", "local"), ("cli", "api"), ("local", "api")}
THIRD_PARTY_FORBIDDEN_IN_CORE = {"celery", "kombu", "redis", "httpx"}


def layer(module: str) -> str | None:
    """The layer a dotted module name belongs to (None: not checkbeat's)."""
    parts = module.split(".")
    if parts[0] == "scheduling_core":
        return "core"
    if parts[0] in ("beat", "workers"):
        return parts[0]
    if parts[0] != "celery_app":
        return None
    if len(parts) == 1:
        return "api"
    if parts[1] in ("redis", "metrics", "cron_tasks", "checks", "cli", "local"):
        return parts[1]
    if parts[1] in FOUNDATION:
        return "foundation"
    if parts[1] in APP:
        return "app"
    raise AssertionError(f"{module}: a celery_app module the layering rule does not place")


def rank(name: str) -> int:
    return RANK.get(name, EDGE_RANK)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return ids


def imports(path: Path) -> set[str]:
    """Absolute module names imported by ``path`` (outside ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_blocks(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def violation(source: str, target: str) -> str | None:
    """Why ``source`` may not import ``target`` (None: allowed)."""
    src, dst = layer(source), layer(target)
    if src == "core" and target.split(".")[0] in THIRD_PARTY_FORBIDDEN_IN_CORE:
        return "scheduling_core is pure"
    if dst is None or src == dst:
        return None
    if rank(dst) < rank(src):
        return None
    if rank(src) == rank(dst) == EDGE_RANK and (src, dst) in EDGE_EDGES:
        return None
    return f"{src} may not import {dst}"


def all_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_every_checkbeat_module_is_placed_in_a_layer():
    assert all(layer(module_name(path)) for path in all_modules())


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_only_downwards(package):
    offenders = {}
    for path in sorted((REPO / package).rglob("*.py")):
        source = module_name(path)
        bad = sorted(
            f"{target} ({why})"
            for target in imports(path)
            if (why := violation(source, target)) is not None
        )
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("scheduling_core.cron", "redis", False),
        ("scheduling_core.cron", "celery_app.settings", False),
        ("celery_app.redis.schema", "celery_app.checks.jobs", False),
        ("celery_app.redis.tls", "celery_app.settings", True),
        ("celery_app.checks.store", "celery_app.cron_tasks.store", False),
        ("celery_app.cron_tasks.service", "celery_app.checks.kinds", False),
        ("celery_app.checks.dispatch", "celery_app.publish", True),
        ("celery_app.publish", "celery_app.cron_tasks.registration", False),
        ("beat.scheduler", "workers.tasks", False),
        ("workers.tasks", "beat.cron_engine", False),
        ("beat.scheduler", "celery_app.checks.dispatch", True),
        ("celery_app.cli.main", "celery_app.local.up", True),
        ("celery_app.local.up", "celery_app.cli.main", False),
        ("celery_app.checks.dispatch", "workers.post_exec", False),
        ("celery_app.cli.checks", "workers.probes", False),
    ],
)
def test_the_rule_itself(source, target, allowed):
    """The rule refuses what the docstring forbids (so the scan above can fail)."""
    assert (violation(source, target) is None) is allowed


def test_fixtures_come_from_one_mechanism():
    """Fixtures live in conftest.py and the plugins the root conftest lists; helpers are
    imported from tests/support. No module lists its own plugins or imports from conftest."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "conftest.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            plugins = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
            )
            from_conftest = isinstance(node, ast.ImportFrom) and node.module == "conftest"
            if plugins or from_conftest:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
