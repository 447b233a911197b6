"""The bounds of any JSON or YAML value a user or tenant writes: nesting depth, integer size and
finite numbers, and a JSON reader that holds to them while it parses.

Why one module: a check's config (``checks add|update --config``, the store API, a checks
file) and a runtime schedule's ``--args``/``--kwargs`` are judged by the same limits
(docs/security.md, "Limits"), and a value past them is refused with one line naming the field
before any other work is done on it. Python's own parsers are no such bound: ``json`` raises
RecursionError past about a thousand levels and ValueError on an integer of over 4,300 digits,
and a value a few hundred levels deep that they do accept makes every later walk of it
(validation, encoding, comparison) recursive and slow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from celery_app.errors import CheckbeatError

#: Levels of objects and lists one value may nest (``{"a": [1]}`` is 2 levels).
MAX_DEPTH = 32
#: Digits an integer may have (beyond any 128-bit integer; a real count or id never has more).
MAX_INT_DIGITS = 40
_INT_BOUND = 10**MAX_INT_DIGITS

Path = tuple[str | int, ...]


class InputLimitError(CheckbeatError, ValueError):
    """A value past a bound: ``field`` names where (``config.headers``, ``--args``, ...),
    ``problem`` says what is wrong and what is allowed."""

    field: str  # always named

    def __init__(
        self, field: str, problem: str, path: Path = (), *, duplicate_key: str | None = None
    ) -> None:
        self.field = field
        self.problem = problem
        self.path = path
        #: The key, when the problem is a key twice in one object.
        self.duplicate_key = duplicate_key
        super().__init__(f"{field}: {problem}" if field else problem)


#: Parts of a path an error shows (a refused depth would otherwise name 32 of them).
SHOWN_PARTS = 6


def path_text(base: str, path: Path) -> str:
    """``base`` followed by ``path`` (``config.headers.X``, ``--args[3]``), its first
    SHOWN_PARTS parts and ``...`` for the rest."""
    text = base
    for part in path[:SHOWN_PARTS]:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text + ("..." if len(path) > SHOWN_PARTS else "")


def too_deep(max_depth: int = MAX_DEPTH) -> str:
    return (
        f"is nested more than {max_depth} levels deep "
        f"(at most {max_depth} levels of objects and lists)"
    )


def int_problem(digits: int) -> str:
    return f"is an integer of {digits:,} digits; at most {MAX_INT_DIGITS} digits are allowed"


def _scalar_problem(value: Any) -> str | None:
    kind = type(value)
    if kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return None
        return int_problem(int(value.bit_length() * 0.30103) + 1)
    if kind is float and not math.isfinite(value):
        return f"must be a finite number, got {value!r} (NaN and infinities are not JSON)"
    return None


def check_value(
    value: Any, field: str, *, max_depth: int = MAX_DEPTH, max_values: int | None = None
) -> None:
    """Refuse ``value`` (InputLimitError naming the place inside ``field``) if it nests deeper
    than ``max_depth`` or holds an integer of more than MAX_INT_DIGITS digits or a non-finite
    float, or (``max_values``) if walking it reaches more values than that, a value shared in
    several places (a YAML alias, or a cycle) counted each time. Iterative: a value of any
    depth is judged without recursion."""
    # (item, depth of its container, key in it, the container's entry): the path is rebuilt
    # from the parents only when something is refused.
    stack: list[tuple[Any, int, Any, Any]] = [(value, 0, None, None)]
    budget = max_values if max_values is not None else -1
    while stack:
        entry = stack.pop()
        item, depth = entry[0], entry[1]
        if isinstance(item, Mapping):
            children: Any = item.items()
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            problem = _scalar_problem(item)
            if problem is not None:
                raise InputLimitError(path_text(field, _path(entry)), problem, _path(entry))
            continue
        if depth >= max_depth:
            raise InputLimitError(path_text(field, _path(entry)), too_deep(max_depth), _path(entry))
        if budget >= 0:
            budget -= len(item)
            if budget < 0:
                raise InputLimitError(
                    field,
                    f"expands to more than {max_values:,} values (YAML aliases (*name) may "
                    "repeat a value, but not past one value per character of the file)",
                )
        for key, child in children:
            problem = _scalar_problem(key)
            if problem is not None:
                raise InputLimitError(path_text(field, _path(entry)), f"a key {problem}")
            if type(child) is not str:
                stack.append((child, depth + 1, key, entry))


def _path(entry: tuple[Any, int, Any, Any]) -> Path:
    parts: list[str | int] = []
    while entry[3] is not None:
        key = entry[2]
        parts.append(key if isinstance(key, int) else str(key))
        entry = entry[3]
    return tuple(reversed(parts))


class _Refused(Exception):
    """Raised inside ``json.loads`` by a hook; not a ValueError, so no caller mistakes it for
    a syntax error."""

    def __init__(self, problem: str, duplicate_key: str | None = None) -> None:
        super().__init__(problem)
        self.duplicate_key = duplicate_key


def _bounded_int(text: str) -> int:
    digits = len(text) - (text[:1] == "-")
    if digits > MAX_INT_DIGITS:
        raise _Refused(int_problem(digits))
    return int(text)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook``: the object, unless a key appears twice in it (``json`` keeps
    the last one silently, so a second ``"uid"`` would quietly replace the first)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(
                    f"has the key {key!r} twice in one object; a key may appear once", key
                )
            seen.add(key)
    return value


def loads_json(
    text: str,
    field: str,
    *,
    max_depth: int = MAX_DEPTH,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] = unique_keys,
) -> Any:
    """``json.loads(text)`` within the bounds of :func:`check_value`, a key twice in one object
    refused: InputLimitError naming ``field`` when past one, ``json.JSONDecodeError`` (a
    ValueError) when not JSON at all."""
    try:
        value = json.loads(text, parse_int=_bounded_int, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise InputLimitError(field, too_deep(max_depth)) from None
    except _Refused as exc:
        raise InputLimitError(field, str(exc), duplicate_key=exc.duplicate_key) from None
    check_value(value, field, max_depth=max_depth)
    return value
