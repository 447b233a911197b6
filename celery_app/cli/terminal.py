"""Text from users, made safe to print on a terminal.

Why: a uid, tenant, target, config value or error message is written by someone else; printed
raw, an ESC in it is a terminal escape sequence (it can retitle the window, hide lines, fake
output) and a bidi override reorders what the operator reads. New names are validated, but
stored data may predate the rules and error texts are free-form, so every command that prints
user text in a table passes it through :func:`escape` (JSON output is escaped by ``json``).
"""

from __future__ import annotations

import unicodedata

from celery_app.names import REFUSED_CATEGORIES


def escape(text: object) -> str:
    """``str(text)`` with control, format and line-separator characters as ``\\x1b``-style
    escapes; every other character, including non-ASCII letters, is kept."""
    value = str(text)
    if value.isprintable():  # the common case: nothing to escape (also covers Cf, Zl, Zp)
        return value
    return "".join(
        ascii(c)[1:-1] if unicodedata.category(c) in REFUSED_CATEGORIES else c for c in value
    )
