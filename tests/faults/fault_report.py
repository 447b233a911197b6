"""The fault suite's numbers (a pytest plugin): every scenario records runs, duplicates, misses
and its slowest recovery; the table is printed at the end of the run and written as JSON.

Reproduce with one command (from the repo root)::

    python -m pytest tests/faults -m "faults and not slow"   # the default variants (~4 min)
    python -m pytest tests/faults -m faults                  # + the slow variants (60 s outage)

The JSON lands in ``<pytest basetemp>/faults-report.json`` (the path is printed under the
table); ``--faults-report=/some/file.json`` chooses it, and so does
``CHECKBEAT_FAULTS_REPORT=/some/file.json``, read once when the plugin registers its option,
before the suite drops every ``CHECKBEAT_*`` variable of the outer environment. tests/conftest.py
lists this plugin in its ``pytest_plugins``.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class FaultRow:
    scenario: str
    runs: int
    duplicates: int
    misses: int
    max_recovery_s: float | None
    notes: dict[str, Any] = field(default_factory=dict)


class FaultReport:
    """Collects rows from the tests of one pytest session (reset by a new session)."""

    def __init__(self) -> None:
        self._rows: list[FaultRow] = []
        self._lock = threading.Lock()

    def add(
        self,
        scenario: str,
        *,
        runs: int,
        duplicates: int = 0,
        misses: int = 0,
        max_recovery_s: float | None = None,
        **notes: Any,
    ) -> FaultRow:
        row = FaultRow(
            scenario,
            runs,
            duplicates,
            misses,
            None if max_recovery_s is None else round(max_recovery_s, 3),
            notes,
        )
        with self._lock:
            self._rows.append(row)
        print(f"\n[faults] {self._line(row)}  {notes}")
        return row

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._rows]

    @staticmethod
    def _line(row: FaultRow) -> str:
        rec = "-" if row.max_recovery_s is None else f"{row.max_recovery_s:.2f}"
        return f"{row.scenario:<52} {row.runs:>6} {row.duplicates:>5} {row.misses:>6} {rec:>10}"

    def table(self) -> str:
        head = f"{'scenario':<52} {'runs':>6} {'dups':>5} {'misses':>6} {'recovery_s':>10}"
        with self._lock:
            return "\n".join([head, "-" * len(head), *(self._line(r) for r in self._rows)])


REPORT = FaultReport()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults-report",
        default=os.environ.get("CHECKBEAT_FAULTS_REPORT"),
        help="where the fault table is written as JSON (default: <basetemp>/faults-report.json; "
        "or set CHECKBEAT_FAULTS_REPORT)",
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    rows = REPORT.rows()
    if not rows:
        return
    target = config.getoption("faults_report")
    if target:
        path = Path(target)
    else:
        path = Path(str(config._tmp_path_factory.getbasetemp())) / "faults-report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2))
    terminalreporter.section("checkbeat fault scenarios")
    for line in REPORT.table().splitlines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"(written to {path})")


@pytest.fixture
def fault_report() -> FaultReport:
    """The suite-wide recorder: ``fault_report.add(scenario, runs=..., duplicates=..., ...)``."""
    return REPORT
