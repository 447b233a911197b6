"""The rules for names users choose: ids, tenants, and free text such as targets.

Why one module: a tenant name is a key component for cron tasks and checks alike, so one rule
must decide what a tenant is (``acme@corp.com`` may not be valid for one and refused by the
other), and every rule matches the whole string (``fullmatch``: ``$`` also matches before a
trailing newline, which made ``"acme\\n"`` a second tenant). Names are plain ASCII, so control
and format characters (terminal escapes, bidi overrides, zero-width joiners) cannot appear in
them; free text (a target) may be any Unicode except those.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

#: Unicode categories refused in user text: control (Cc, e.g. ESC, NUL, newline), format (Cf,
#: e.g. U+202E right-to-left override, U+200B zero width space), surrogates (Cs) and the line
#: and paragraph separators (Zl, Zp) that break a line as a newline does.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

MAX_ID = 200
MAX_TENANT = 128

ID_RULE = f"1-{MAX_ID} letters, digits, '_', '.' or '-'"
TENANT_RULE = (
    f"1-{MAX_TENANT} letters, digits, '_', '.', '@' or '-', starting with a letter or digit"
)

_ID = re.compile(rf"[A-Za-z0-9_.\-]{{1,{MAX_ID}}}")
_TENANT = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.@\-]{{0,{MAX_TENANT - 1}}}")


def is_id(value: Any) -> bool:
    """A cron task id or a check uid: it becomes a key component and a Celery name part."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def is_tenant(value: Any) -> bool:
    """A tenant of cron tasks and of checks (the same rule for both)."""
    return isinstance(value, str) and _TENANT.fullmatch(value) is not None


def refused_characters(text: str) -> list[str]:
    """The distinct characters of ``text`` in REFUSED_CATEGORIES, escaped (``'\\x1b'``)."""
    found = sorted({c for c in text if unicodedata.category(c) in REFUSED_CATEGORIES})
    return [ascii(c)[1:-1] for c in found]
