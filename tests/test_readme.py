"""README.md stays true: its configuration table is the code's, its commands are the CI's."""

from __future__ import annotations

import re
from pathlib import Path

from celery_app.settings import Settings, settings_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_configuration_table_matches_the_settings():
    block = re.search(r"<!-- settings-table[^>]*-->\n(.*?)\n<!-- /settings-table -->", README, re.S)
    assert block, "README has no settings table block"
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
