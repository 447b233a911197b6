"""The type checker's contract (``[tool.mypy]`` in pyproject.toml; .ci/run runs mypy).

Every ``# type: ignore`` in the packages names the error code it silences and says why on the
same line (``# type: ignore[code]  # why``): a bare ignore would hide any error on its line,
and one without a reason leaves the next engineer to guess whether it still holds (mypy's
``warn_unused_ignores`` drops the ones that no longer silence anything).
"""

from __future__ import annotations

import io
import re
import tokenize
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduling_core", "celery_app", "beat", "workers")

IGNORE = re.compile(r"type:\s*ignore", re.IGNORECASE)
# the ignore with its codes, then the reason as a comment of its own
ALLOWED = re.compile(r"# type: ignore\[[a-z-]+(, ?[a-z-]+)*\]  # \S")


def bad_ignores(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each type-ignore comment in ``source`` without a code and a reason."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        start = IGNORE.search(token.string)
        if start is None:
            continue
        comment = token.string[token.string.rindex("#", 0, start.start() + 1) :]
        if not ALLOWED.match(comment):
            found.append((token.start[0], token.string))
    return found


def test_every_type_ignore_has_a_code_and_a_reason():
    found = [
        f"{path.relative_to(REPO)}:{line}: {comment}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for line, comment in bad_ignores(path.read_text())
    ]
    assert not found, "a type: ignore needs [code] and '  # why':\n" + "\n".join(found)


def test_tests_and_benches_carry_no_type_ignore():
    """mypy checks the packages only ([tool.mypy] files): in tests/ and bench/ an ignore would
    silence nothing, and say something untrue to the reader."""
    found = [
        f"{path.relative_to(REPO)}:{token.start[0]}"
        for folder in ("tests", "bench")
        for path in sorted((REPO / folder).rglob("*.py"))
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type == tokenize.COMMENT and IGNORE.search(token.string)
    ]
    assert not found, found


@pytest.mark.parametrize(
    ("line", "allowed"),
    [
        ("x = f()  # type: ignore[arg-type]  # set by the caller\n", True),
        ("x = f()  # type: ignore[misc, attr-defined]  # a mixin\n", True),
        ("x = f()  # fmt: skip  # type: ignore[misc]  # a mixin\n", True),
        ("x = f()  # type: ignore\n", False),
        ("x = f()  # type: ignore  # why\n", False),
        ("x = f()  # type: ignore[arg-type]\n", False),
        ("x = f()  # type: ignore[arg-type] - dash, not a comment\n", False),
        ("x = f()  # type:ignore[arg-type]  # spelled without the space\n", False),
        ('x = "# type: ignore"  # a string is no comment\n', True),
    ],
)
def test_the_ignore_rule_itself(line, allowed):
    assert (bad_ignores(line) == []) is allowed


def test_mypy_checks_every_package():
    """What .ci/run type-checks: the four packages (tests and bench run, they are not checked),
    strict on scheduling_core and the public API's modules."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(config["files"]) == sorted(PACKAGES)
    strict = next(o for o in config["overrides"] if "disallow_untyped_defs" in o)
    assert {"scheduling_core.*", "celery_app", "celery_app.factory"} <= set(strict["module"])
    assert "mypy" in (REPO / ".ci" / "run").read_text()
