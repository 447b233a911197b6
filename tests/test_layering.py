"""Imports point one way (docs/architecture.md):

    scheduling_core <- foundation <- redis <- app <- cron_tasks | checks
        <- beat | workers | cli | local

- scheduling_core is pure: no checkbeat module, no celery, kombu, redis or httpx.
- foundation (``celery_app.settings``, ``wall_clock``, ``errors``, ``findings``, ``names``,
  ``gc_pause``, ...) knows no Redis or Celery state; ``celery_app.redis`` (client, TLS, schema,
  scripts) knows no cron task or check.
- app (``celery_app.factory``, ``publish``, ``registry``, ``worker_options``, ``shadowing``)
  builds and serves the Celery app; ``cron_tasks`` and ``checks`` are siblings that never
  import each other.
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
FOUNDATION = {
    "settings",
    "wall_clock",
    "errors",
    "findings",
    "names",
    "cluster_url",
    "input_limits",
    "gc_pause",
}
APP = {"factory", "publish", "registry", "worker_options", "shadowing"}
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
        ("celery_app.checks.store", "celery_app.cron_tasks.cron_state", False),
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


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("pytest.fixture", "fixture")


def _fixture_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and _is_fixture(decorator):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return node.name


def _autouse(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call)
        and _is_fixture(d)
        and any(k.arg == "autouse" and ast.unparse(k.value) == "True" for k in d.keywords)
        for d in node.decorator_list
    )


def _shape(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """A fixture as what it does: its arguments and body, without its name or docstring."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(node.args) + "".join(ast.dump(stmt) for stmt in body)


def _fixture_plugins() -> set[Path]:
    """tests/conftest.py and the modules its ``pytest_plugins`` lists."""
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    (names,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets)
    ]
    return {REPO / "tests" / "conftest.py"} | {
        REPO / "tests" / (name.replace(".", "/") + ".py") for name in names
    }


def fixture_rule_offences(root: Path, plugins: set[Path]) -> list[str]:
    """Where the test modules under ``root`` break the fixture rule (see the test below)."""
    modules = {path: ast.parse(path.read_text(), filename=str(path)) for path in root.rglob("*.py")}
    fixtures = {
        path: [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(_is_fixture(d) for d in node.decorator_list)
        ]
        for path, tree in modules.items()
    }
    shared_names = {_fixture_name(f) for path in plugins for f in fixtures.get(path, [])}
    by_shape: dict[str, list[tuple[Path, str]]] = {}
    for path, defined in sorted(fixtures.items()):
        for node in defined:
            by_shape.setdefault(_shape(node), []).append((path, node.name))
    # Two of one shape in one module are two instances (a second server); across modules, a copy.
    offences = [
        " and ".join(f"{path.relative_to(root)}::{name}" for path, name in places)
        + ": one fixture, copied"
        for places in by_shape.values()
        if len({path for path, _ in places}) > 1
    ]
    for path, tree in sorted(modules.items()):
        where = path.relative_to(root)
        if path.name != "conftest.py":
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
                ):
                    offences.append(f"{where}:{node.lineno}: lists its own plugins")
                if isinstance(node, ast.ImportFrom) and node.module == "conftest":
                    offences.append(f"{where}:{node.lineno}: imports from conftest")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                source = root / (node.module.replace(".", "/") + ".py")
                named = {alias.name for alias in node.names}
                imported = named & {f.name for f in fixtures.get(source, [])}
                if imported:
                    offences.append(f"{where}:{node.lineno}: imports fixtures {sorted(imported)}")
        if path in plugins or not fixtures[path]:
            continue
        if not path.name.startswith("test_"):
            names = sorted(f.name for f in fixtures[path])
            offences.append(f"{where}: defines fixtures {names} (not a test module or plugin)")
            continue
        requested = {
            arg.arg
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for arg in node.args.args
        } | {
            str(arg.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("usefixtures")
            for arg in node.args
            if isinstance(arg, ast.Constant)
        }
        for node in fixtures[path]:
            name = _fixture_name(node)
            if name in shared_names:
                offences.append(f"{where}::{name}: overrides the plugins' fixture of that name")
            if not _autouse(node) and name not in requested:
                offences.append(f"{where}::{name}: used by none of its module's tests")
    return offences


def test_fixtures_come_from_one_mechanism():
    """Fixtures live in tests/conftest.py and the plugins its ``pytest_plugins`` lists; helpers
    (functions, constants, classes) are imported from tests/support. A test module may define a
    fixture for itself alone: one its own tests use, that has the name of no conftest or plugin
    fixture (no override for a reader to hunt down), and whose arguments and body are not those
    of a fixture in another module under tests/ (a fixture two modules need is one fixture, in a
    plugin). No other module defines a fixture; no module lists its own plugins, imports from
    conftest, or imports a fixture from another module."""
    offences = fixture_rule_offences(REPO / "tests", _fixture_plugins())
    assert not offences, "\n".join(offences)


def test_tests_never_import_bench():
    """A test never imports bench/: a bench runs as its own process (``support.benches``) and
    what tests and benches share lives in tests/support, which benches import."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                ("spec_from_file_location", "run_path")
            ):
                # a module loaded by its file path (a bench, under another name)
                names = ["bench"] if "bench" in ast.unparse(node) else []
            if any(name.split(".")[0] == "bench" for name in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_in_process_workers_come_from_the_fixtures():
    """An in-process worker is pytest-celery's ``celery_worker`` (one for the test, on the app
    ``celery_app`` names) or the ``run_worker`` factory (started and stopped inside a test, on
    the queues it names); both wrap ``celery.contrib.testing.worker.start_worker``, and only
    the plugin that defines them calls it. Where a process is what is tested, a test starts a
    real one (``start_worker_process``)."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "worker_fixtures.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "celery.contrib.testing.worker":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_the_fixture_rule_itself(tmp_path):
    """The rule refuses what its docstring forbids (so the scan above can fail)."""
    files = {
        "plugin_fixtures.py": "@pytest.fixture\ndef app(settings):\n    return make(settings)\n",
        "test_copy.py": (
            "@pytest.fixture\ndef made(settings):\n    return make(settings)\n\n"
            "def test_x(made): ...\n"
        ),
        "test_override.py": "@pytest.fixture\ndef app():\n    return 1\n\ndef test_x(app): ...\n",
        "test_unused.py": "@pytest.fixture\ndef lonely():\n    return 2\n\ndef test_x(): ...\n",
        "test_own.py": (
            "@pytest.fixture\ndef mine():\n    return 3\n\n"
            "@pytest.fixture(autouse=True)\ndef around():\n    yield\n\n"
            "@pytest.fixture\ndef twin():\n    return 3\n\n"
            "def test_x(mine, twin): ...\n"
        ),
        "test_imports.py": "from plugin_fixtures import app\n\ndef test_x(app): ...\n",
        "helpers.py": "@pytest.fixture\ndef hidden():\n    return 4\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    offences = fixture_rule_offences(tmp_path, {tmp_path / "plugin_fixtures.py"})
    assert sorted(offences) == sorted(
        [
            "plugin_fixtures.py::app and test_copy.py::made: one fixture, copied",
            "test_override.py::app: overrides the plugins' fixture of that name",
            "test_unused.py::lonely: used by none of its module's tests",
            "test_imports.py:1: imports fixtures ['app']",
            "helpers.py: defines fixtures ['hidden'] (not a test module or plugin)",
        ]
    )
