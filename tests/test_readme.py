"""README.md and the docs stay true: the configuration table is the code's, the commands are the
CI's, and every page of docs/ is reachable from the docs index."""

from __future__ import annotations

import re
from pathlib import Path

from celery_app.settings import Settings, settings_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def test_configuration_table_matches_the_settings():
    block = re.search(
        r"<!-- settings-table[^>]*-->\n(.*?)\n<!-- /settings-table -->", CONFIGURATION, re.S
    )
    assert block, "docs/configuration.md has no settings table block"
    assert block.group(1) == settings_markdown(), "run `checkbeat settings` and paste the table"
    for name in Settings.model_fields:
        assert f"`CHECKBEAT_{name.upper()}`" in block.group(1)


def test_readme_opens_with_exactly_two_setup_commands():
    commands = re.findall(r"<!-- (run|test)-command -->\n```\n(.+?)\n```", README)
    assert [kind for kind, _ in commands] == ["run", "test"]
    run, test = (cmd for _, cmd in commands)
    assert "pip install" in run and "checkbeat up" in run
    assert "pip install" in test and "pytest" in test
    assert README.index("<!-- test-command -->") < README.index("## How it flows")


def test_readme_reads_in_five_minutes():
    # What it is, the two commands, a tour and where to read next; the rest lives in docs/.
    assert len(README.splitlines()) <= 200


def test_every_doc_is_linked_from_the_docs_index():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]+)?\)", index))
    pages = {path.name for path in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "add these pages to docs/README.md"


def test_relative_links_in_the_docs_point_at_files_that_exist():
    documents = [ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")]
    broken = []
    for document in documents:
        for target in re.findall(r"\]\((?!https?:|#)([^)#\s]+)", document.read_text()):
            if not (document.parent / target).exists():
                broken.append(f"{document.relative_to(ROOT)} -> {target}")
    assert broken == []
