"""The configuration table of docs/configuration.md (and ``checkbeat settings``), rendered from
the model's declarations so it cannot drift from the code."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_app.settings.declare import ENV_PREFIX, described
from celery_app.settings.model import Settings


def _default_text(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value) or "(empty)"
    return str(value) or "(empty)"


def settings_markdown() -> str:
    """The configuration table of docs/configuration.md, generated so it cannot drift from the
    code."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        default = info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]  # takes no data
        meaning = described(info).replace("|", "\\|")
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{_default_text(default)}` | {meaning} |")
    return "\n".join(rows)
