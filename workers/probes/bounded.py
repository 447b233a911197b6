"""The work the http probe does on a response body, each piece bounded by the run's deadline and
by memory caps: the regular expression, the JSON document, the JMESPath evaluation over it and
the rendering of what it found.

Why: the body comes from the target and the rules from the tenant, and a worker's slots share
one process. A pure-Python or GIL-holding step that a body or a rule can make long (a
backtracking regex, a deeply nested document, an expression that doubles a list forty times)
would stall every slot of a threads worker, not only the run's own, and hold the slot past the
run's deadline. So:

- **regex**: RE2 (``google-re2``), linear in the body and releasing the GIL while it matches.
  Its cost is still the body's length times the pattern's program size, so a pattern is refused
  at write above :data:`MAX_REGEX_PROGRAM_SIZE`, and a search whose worst case exceeds
  :data:`INLINE_REGEX_COST` runs in a helper thread at the lowest CPU priority, waited for only
  until the deadline (it then finishes on its own, within that bounded worst case, while the
  slot is already free);
- **JSON**: parsed only up to :data:`MAX_JSON_DEPTH` levels (checked by a linear pass in C
  before the parser recurses), from a body already capped at the probe's body cap;
- **JMESPath**: evaluated by an interpreter that checks the deadline at every node, refuses any
  intermediate value larger than :data:`MAX_JSON_PATH_ITEMS` before building it, and compares
  and serialises values with bounded loops (a value built by the expression may share its parts
  many times over, so its expanded size can be exponential in the expression's length).

Each bound broken is a :class:`BodyRuleBroken` (the probe records a ``body`` failure with its
message) or :class:`~workers.deadline.DeadlineExceeded` (a ``timeout``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import threading
from array import array
from typing import TYPE_CHECKING, Any

import jmespath
import jmespath.exceptions
import jmespath.functions
import jmespath.visitor
import re2

from celery_app.errors import CheckbeatError
from workers.deadline import Deadline, DeadlineExceeded

if TYPE_CHECKING:
    from jmespath.visitor import (
        _TreeNode as TreeNode,  # the parsed node, as types-jmespath names it
    )


#: The largest compiled RE2 program a ``body_regex`` may have (ordinary patterns need under
#: 60): a search costs at most about this many steps per body byte.
MAX_REGEX_PROGRAM_SIZE = 300
#: Program size x body length up to which a search runs inline: its worst case is a few ms.
INLINE_REGEX_COST = 1 << 22
#: The deepest nesting of arrays and objects a JSON body may have to be judged.
MAX_JSON_DEPTH = 64
#: The most items (array elements, object members, string characters) a value built while
#: evaluating ``json_path`` may have.
MAX_JSON_PATH_ITEMS = 1 << 20
#: The longest text ``to_string`` renders (rendering is piece by piece, so kept short).
MAX_TO_STRING_CHARS = 64 * 1024
#: How many comparison or serialisation steps run between two deadline checks.
_STEPS_PER_CHECK = 4096


class BodyRuleBroken(CheckbeatError, ValueError):
    """The body, or what a rule made of it, breaks a bound (the message says which)."""


# --- regex ---------------------------------------------------------------------------------------


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # an invalid pattern is reported to the user, not to stderr
    options.never_capture = True  # only whether it matches is judged
    return options


@functools.lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2; ValueError naming what is wrong (RE2's own message, or a
    program larger than :data:`MAX_REGEX_PROGRAM_SIZE`)."""
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(
            f"is not a valid RE2 regular expression ({reason}); RE2 has no backreferences "
            "or lookaround, which is what keeps a match linear in the body"
        ) from None
    if compiled.programsize > MAX_REGEX_PROGRAM_SIZE:
        raise ValueError(
            f"compiles to {compiled.programsize} RE2 instructions; at most "
            f"{MAX_REGEX_PROGRAM_SIZE} are allowed (large counted repetitions such as "
            "'(a|b){1,500}' cost that much per body byte)"
        )
    return compiled


def _lowest_cpu_priority() -> None:
    """Give the calling thread the lowest CPU priority (nice 19; on Linux it applies to the
    thread alone). Why: a costly search may go on after its run's deadline, while its slot
    already runs other work; when CPU is short, that work, the worker's other slots and
    ``/healthz`` come first. Raising a nice value needs no privilege."""
    with contextlib.suppress(AttributeError, OSError):  # elsewhere it runs as it is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def regex_search(pattern: str, text: str, deadline: Deadline) -> bool:
    """Whether ``pattern`` (valid for :func:`compile_regex`) matches somewhere in ``text``.

    DeadlineExceeded if the search has not finished by ``deadline``: only a search whose worst
    case is above :data:`INLINE_REGEX_COST` can take that long, and it runs in a daemon thread
    this waits for until the deadline (RE2 releases the GIL while it matches, so that thread
    stalls no other slot, and its cost is bounded by the program size cap).
    """
    compiled = compile_regex(pattern)
    if compiled.programsize * len(text) <= INLINE_REGEX_COST:
        return compiled.search(text) is not None
    outcome: list[Any] = []
    done = threading.Event()

    def search() -> None:
        _lowest_cpu_priority()
        try:
            outcome.append(compiled.search(text) is not None)
        except BaseException as exc:  # handed to the waiting run below
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=search, name="checkbeat-body-regex", daemon=True).start()
    if not done.wait(deadline.remaining()):
        raise DeadlineExceeded(f"body_regex did not finish within {deadline.timeout_s:g} s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return bool(outcome[0])


# --- JSON ----------------------------------------------------------------------------------------

#: Every byte but the quote and the brackets, dropped before the depth is counted.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
#: Opening brackets to +1, closing ones to -1 (as signed bytes).
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of ``text`` (a JSON document) nest, from linear passes
    in C: escapes and strings are removed, then the brackets summed (a string's brackets do not
    count). Never raises; an invalid document gives a number the parser then refuses."""
    data = text.encode("utf-8", "surrogatepass")
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # escapes pair from the left
    data = data.translate(None, _NOT_STRUCTURE)
    data = b"".join(data.split(b'"')[::2])  # outside strings: every other piece
    steps = array("b", data.translate(_DEPTH_STEP))
    return max(itertools.accumulate(steps), default=0)


def parse_json(text: str) -> Any:
    """``text`` as a JSON value: ValueError if it is not JSON, BodyRuleBroken if it nests
    deeper than :data:`MAX_JSON_DEPTH`."""
    opened = text.count("[") + text.count("{")  # a bound on the depth, found faster
    depth = json_depth(text) if opened > MAX_JSON_DEPTH else 0
    if depth > MAX_JSON_DEPTH:
        raise BodyRuleBroken(f"body nests {depth} levels deep; at most {MAX_JSON_DEPTH} are judged")
    try:
        return json.loads(text)
    except RecursionError:  # the parser's own limit, below ours in a deep call stack
        raise BodyRuleBroken(f"body nests too deeply to parse (at most {MAX_JSON_DEPTH})") from None


# --- JMESPath ------------------------------------------------------------------------------------


class Steps:
    """A counter that checks the deadline (if any) every :data:`_STEPS_PER_CHECK` steps."""

    __slots__ = ("deadline", "n")

    def __init__(self, deadline: Deadline | None) -> None:
        self.deadline = deadline
        self.n = 0

    def step(self, count: int = 1) -> None:
        self.n += count
        if self.n >= _STEPS_PER_CHECK:
            self.n = 0
            if self.deadline is not None:
                self.deadline.check("evaluating json_path")


def _too_large(what: str, size: int) -> BodyRuleBroken:
    return BodyRuleBroken(
        f"json_path would build {what} of {size} items; at most {MAX_JSON_PATH_ITEMS} are allowed"
    )


def _sized(value: Any) -> Any:
    if isinstance(value, list | dict | str) and len(value) > MAX_JSON_PATH_ITEMS:
        raise _too_large(type(value).__name__, len(value))
    return value


def bounded_equal(a: Any, b: Any, steps: Steps) -> bool:
    """JSON equality (``true`` is not ``1``, ``1`` is ``1.0``), iterative, with every element
    compared counted against the deadline: two values the expression built may share their
    parts, so Python's recursive ``==`` on them could take exponential time holding the GIL."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        steps.step()
        if x is y and not isinstance(x, float):
            continue
        if isinstance(x, bool) or isinstance(y, bool):
            if not (isinstance(x, bool) and isinstance(y, bool) and x == y):
                return False
        elif isinstance(x, int | float) and isinstance(y, int | float):
            if x != y:
                return False
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif type(x) is not type(y) or x != y:
            return False
    return True


def bounded_dumps(value: Any, limit: int, steps: Steps) -> str:
    """``value`` as compact JSON, at most ``limit`` characters (BodyRuleBroken past it), built
    piece by piece so an expanded size far larger than the value's memory is never produced."""
    encoder = json.JSONEncoder(separators=(",", ":"), default=str)  # as jmespath renders
    pieces: list[str] = []
    size = 0
    try:
        for piece in encoder.iterencode(value):  # not one-shot: a generator, piece by piece
            size += len(piece)
            if size > limit:
                raise BodyRuleBroken(f"json_path's value is over {limit} characters as JSON")
            pieces.append(piece)
            steps.step()
    except RecursionError:
        raise BodyRuleBroken("json_path's value nests too deeply to render") from None
    return "".join(pieces)


class _Functions(jmespath.functions.Functions):
    """JMESPath's functions, with those whose cost is not bounded by their inputs' sizes
    (``join``, ``to_string``, ``contains``) bounded."""

    steps: Steps

    @jmespath.functions.signature({"types": ["string"]}, {"types": ["array-string"]})
    def _func_join(self, separator: str, array: list[str]) -> str:
        size = sum(len(item) for item in array) + len(separator) * max(len(array) - 1, 0)
        if size > MAX_JSON_PATH_ITEMS:
            raise _too_large("a string", size)
        return separator.join(array)

    @jmespath.functions.signature({"types": []})
    def _func_to_string(self, arg: Any) -> str:
        if isinstance(arg, str):
            return arg
        return bounded_dumps(arg, MAX_TO_STRING_CHARS, self.steps)

    @jmespath.functions.signature({"types": ["array", "string"]}, {"types": []})
    def _func_contains(self, subject: Any, search: Any) -> bool:
        if isinstance(subject, str):
            return isinstance(search, str) and search in subject
        return any(bounded_equal(item, search, self.steps) for item in subject)


class _Interpreter(jmespath.visitor.TreeInterpreter):
    """JMESPath's tree interpreter with a deadline check at every node and a size check on
    every value it builds (flattening is sized before it is built)."""

    def __init__(self, steps: Steps) -> None:
        functions = _Functions()
        functions.steps = steps
        super().__init__(jmespath.visitor.Options(custom_functions=functions))
        self._steps = steps
        self.COMPARATOR_FUNC = {  # type: ignore[misc]  # per instance: they count its steps
            **self.COMPARATOR_FUNC,
            "eq": lambda x, y: bounded_equal(x, y, steps),
            "ne": lambda x, y: not bounded_equal(x, y, steps),
        }

    def visit(self, node: TreeNode, *args: Any, **kwargs: Any) -> Any:
        value = _sized(super().visit(node, *args, **kwargs))
        # a node's work is about the size of what it built (a projection, a flatten)
        self._steps.step(len(value) + 1 if isinstance(value, list | dict | str) else 1)
        return value

    def visit_projection(self, node: TreeNode, value: Any) -> Any:
        """A projection of the identity (what ``a[]`` and ``a[*]`` end with) without a visit per
        element: a list is checked once, not element by element."""
        if node["children"][1]["type"] != "identity":
            return super().visit_projection(node, value)
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        return [element for element in base if element is not None]

    def visit_flatten(self, node: TreeNode, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        size = sum(len(item) if isinstance(item, list) else 1 for item in base)
        if size > MAX_JSON_PATH_ITEMS:
            raise _too_large("a list", size)
        merged: list[Any] = []
        for item in base:
            if isinstance(item, list):
                merged.extend(item)
            else:
                merged.append(item)
        return merged


@functools.lru_cache(maxsize=1024)
def compile_json_path(path: str) -> Any:
    """``path`` parsed as JMESPath (``jmespath.exceptions.JMESPathError`` if it is not)."""
    return jmespath.compile(path)


def json_path_search(path: str, document: Any, deadline: Deadline) -> tuple[Any, Steps]:
    """What ``path`` yields on ``document``, within ``deadline`` and the size caps; and the step
    counter, for comparing and rendering the value under the same deadline."""
    steps = Steps(deadline)
    interpreter = _Interpreter(steps)
    try:
        return interpreter.visit(compile_json_path(path).parsed, document), steps
    except RecursionError:
        raise BodyRuleBroken("json_path's evaluation nests too deeply") from None
    except jmespath.exceptions.JMESPathError as exc:  # e.g. a function given the wrong type
        raise BodyRuleBroken(
            f"json_path cannot be evaluated: {' '.join(str(exc).split())}"
        ) from None


__all__ = [
    "INLINE_REGEX_COST",
    "MAX_JSON_DEPTH",
    "MAX_JSON_PATH_ITEMS",
    "MAX_REGEX_PROGRAM_SIZE",
    "MAX_TO_STRING_CHARS",
    "BodyRuleBroken",
    "DeadlineExceeded",
    "Steps",
    "bounded_dumps",
    "bounded_equal",
    "compile_json_path",
    "compile_regex",
    "json_depth",
    "json_path_search",
    "parse_json",
    "regex_search",
]
