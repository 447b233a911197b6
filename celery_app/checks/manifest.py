"""The checks-as-code file (``checks apply -f checks.yaml``): reading it and validating all of it.

Why its own module: the whole file is validated before anything is written, and each problem
is reported with its place (``file:line: checks[12] (uid 'web'): config.body_regex: ...``).
Reading is pure except for the file itself; comparing with the store and writing is
:mod:`celery_app.checks.manifest_sync`. The format is documented in ``docs/checks-as-code.md``.

Ambiguity and cost are refused before any work (docs/checks-as-code.md, "What a file may not
hold"): a key twice in one mapping (YAML and ``json`` keep the last one silently, so a second
``uid`` would overwrite another check) is an error naming both lines; YAML aliases construct to
shared values, and the first walk of the document counts every value each time it is reached
and stops at one per character of the file (a few hundred bytes of nested aliases stand for
gigabytes), before validation walks it; nesting, integers and the file's size are bounded
(:mod:`celery_app.input_limits`, :data:`MAX_FILE_BYTES`), so reading costs time in
proportion to the file.

Speed: PyYAML's C loader builds plain values; line numbers are needed only when something is
wrong, so the node tree with its marks is composed only then. A bulk read allocates millions of
objects that all stay alive, so the cyclic garbage collector is paused meanwhile
(:func:`celery_app.gc_pause.gc_paused`): it would scan the growing heap again and again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from celery_app.checks.definition import CheckDefinition, validate_definition
from celery_app.checks.maintenance import Window, validate_window
from celery_app.checks.notify import NotifyTarget, looks_masked, validate_target
from celery_app.checks.ratelimit import default_burst, validate_rate_limit
from celery_app.errors import CheckbeatError, CheckFieldError
from celery_app.gc_pause import gc_paused
from celery_app.input_limits import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    InputLimitError,
    check_value,
    int_problem,
    loads_json,
    path_text,
    too_deep,
)
from celery_app.names import TENANT_RULE, is_tenant
from celery_app.redis.schema import maintenance_scope
from celery_app.registry import SHARED, Registry
from celery_app.settings import Settings

FORMAT_VERSION = 1
TOP_KEYS = ("version", "tenants", "checks")
TENANT_KEYS = ("rate_limit", "maintenance", "notify")
RATE_LIMIT_KEYS = ("per_minute", "burst")
WINDOW_KEYS = ("cron", "duration", "timezone")
DURATION_TEXT = "or a text such as '90m', '2h', '1h30m', '1d'"
#: Problems listed in one refusal (the count of the rest is given).
MAX_PROBLEMS_SHOWN = 50
#: The largest file ``checks apply`` reads (about 300,000 checks as YAML).
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Values any file may expand to, however short (beyond that: one per character).
MIN_VALUES = 10_000
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the file: where (a path into it) and what."""

    path: Path
    message: str
    line: int | None = None
    uid: str | None = None

    def shown(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        place = _path_text(self.path)
        if self.uid:
            place = f"{place} (uid {self.uid!r})"
        return f"{where}: {place}: {self.message}" if place else f"{where}: {self.message}"


def too_large() -> str:
    return (
        f"is larger than {MAX_FILE_BYTES // 2**20} MiB, the most a checks file may be; split it "
        "(one file per tenant or team: --prune acts only on the tenants a file names)"
    )


class _Refused(yaml.MarkedYAMLError):
    """Something a checks file may not hold (a key twice, a huge integer); not a syntax
    error, so it is shown without "not valid YAML"."""


class _StrictLoader(_BASE_LOADER):
    """PyYAML's safe loader (the C one when built) refusing, while it constructs the
    document, what would make it ambiguous or costly: a key twice in one mapping, an integer of
    more than MAX_INT_DIGITS digits. Aliases construct to shared values (no copy); how far they
    expand is bounded by the walk that follows (:func:`_load`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Before the merge keys (<<) are flattened in: a key a merge brings and the mapping
        # sets again is YAML's override, not a duplicate.
        if isinstance(node, yaml.MappingNode) and len(node.value) > 1:
            first: dict[tuple[str, str], yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                    continue
                seen = first.setdefault((key_node.tag, key_node.value), key_node)
                if seen is not key_node:
                    line, again = seen.start_mark.line + 1, key_node.start_mark.line + 1
                    raise _Refused(
                        None,
                        None,
                        f"the key {key_node.value!r} appears twice in one mapping (lines "
                        f"{line} and {again}); a key may appear once",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(char.isdigit() for char in node.value)
        if digits > MAX_INT_DIGITS:
            raise _Refused(None, None, int_problem(digits), node.start_mark)
        return super().construct_yaml_int(node)


_MERGE = "tag:yaml.org,2002:merge"
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_LOADER = _StrictLoader


class ManifestError(CheckbeatError, ValueError):
    """The file was refused; nothing was written. ``problems`` lists every one found."""

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:  # one line
            super().__init__(f"{self.problems[0].shown(source)} (nothing written)")
            return
        shown = [p.shown(source) for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        more = len(self.problems) - len(shown)
        if more > 0:
            shown.append(f"... and {more} more")
        head = f"{source}: {len(self.problems)} problem(s), nothing written"
        super().__init__("\n".join([head, *(f"  {line}" for line in shown)]))


@dataclass(frozen=True)
class TenantSpec:
    """A tenant named in the ``tenants`` section: its bucket (None = no rate limit)."""

    name: str
    rate_limit: tuple[float, float] | None


@dataclass(frozen=True)
class Manifest:
    """A whole validated file."""

    checks: tuple[CheckDefinition, ...]
    tenants: Mapping[str, TenantSpec] = field(default_factory=dict)
    #: Every window of the file (validated by the store's own ``validate_window``).
    windows: tuple[Window, ...] = ()
    #: The maintenance scopes (``check:<uid>``, ``tenant:<t>``) the file gives a ``maintenance``
    #: key, even an empty list: their stored windows are made to match it.
    window_scopes: frozenset[str] = frozenset()
    #: Every notification target of the file; one whose URL is masked (as ``checks export``
    #: writes it) is not validated here: it stands for a stored target (``manifest_sync``).
    targets: tuple[NotifyTarget, ...] = ()
    #: The scopes the file gives a ``notify`` key, even an empty list.
    target_scopes: frozenset[str] = frozenset()

    def scope(self) -> set[str]:
        """The tenants ``--prune`` may delete checks of: every tenant the file names."""
        return set(self.tenants) | {c.tenant for c in self.checks}

    def pruned_window_scopes(self) -> set[str]:
        """The maintenance scopes ``--prune`` empties of windows the file omits: those with a
        ``maintenance`` key, every listed check's and every tenant of :meth:`scope`."""
        return (
            set(self.window_scopes)
            | {maintenance_scope(uid=c.uid) for c in self.checks}
            | {maintenance_scope(tenant=t) for t in self.scope()}
        )


# --- reading ---------------------------------------------------------------------------------


def load_manifest(
    text: str, settings: Settings, *, registry: Registry = SHARED, source: str = "<input>"
) -> Manifest:
    """Parse and validate a whole file, or raise ManifestError listing every problem (with its
    line) before anything could be written."""
    if len(text) > MAX_FILE_BYTES:  # characters: at least as many bytes
        raise ManifestError(source, [Problem((), too_large())])
    with gc_paused():
        return _load(text, settings, registry, source)


#: A JSON string, or what the JSON reader refused (a bracket past the depth, a long integer).
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_JSON_BRACKETS = re.compile(rf"{_JSON_STRING}|[\[\]{{}}]")
_JSON_LONG_INT = re.compile(rf"{_JSON_STRING}|-?\d{{{MAX_INT_DIGITS + 1},}}")


def _json_line(text: str, refused: InputLimitError) -> int | None:
    """The line of what the JSON reader refused without a place: the first bracket past the
    depth bound, or the first long integer (scanned only on this error path)."""
    if refused.problem.startswith("is an integer"):
        for match in _JSON_LONG_INT.finditer(text):
            if match.group()[0] != '"':
                return text.count("\n", 0, match.start()) + 1
        return None
    depth = 0
    for match in _JSON_BRACKETS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return text.count("\n", 0, match.start()) + 1
        elif char in "]}":
            depth -= 1
    return None


def _parse(text: str) -> Any:
    """The file's data. A JSON document (JSON is YAML too) is read by ``json``, far faster;
    anything else, JSON that does not parse, or JSON with a key twice (so that the error names
    both lines) by the YAML loader (whose errors have lines)."""
    if text.lstrip()[:1] == "{":
        try:
            return loads_json(text, "")
        except InputLimitError as exc:
            if exc.duplicate_key is None:
                raise _FileProblem(exc.path, exc.problem, _json_line(text, exc)) from None
            duplicate = exc
        except ValueError:
            duplicate = None
        if duplicate is None:
            return yaml.load(text, Loader=_LOADER)
        try:  # for the lines of both keys
            yaml.load(text, Loader=_LOADER)
        except _Refused:
            raise
        except yaml.YAMLError:
            pass
        raise _FileProblem((), duplicate.problem, None)  # what json found, without lines
    return yaml.load(text, Loader=_LOADER)


class _FileProblem(Exception):
    """One problem of the whole file, found while reading it (before any validation)."""

    def __init__(self, path: Any, message: str, line: int | None) -> None:
        super().__init__(message)
        self.problem = Problem(tuple(path), message, line)


def _load(text: str, settings: Settings, registry: Registry, source: str) -> Manifest:
    try:
        data = _parse(text)
        # Values are counted as they are walked, shared ones (YAML aliases) each time they are
        # reached: past one per character of the file, aliases multiply it (a few hundred bytes
        # can stand for gigabytes), and it is refused before anything else walks it.
        check_value(data, "", max_values=len(text) + MIN_VALUES)
    except _FileProblem as exc:
        raise ManifestError(source, [exc.problem]) from None
    except RecursionError:  # the pure-Python YAML composer (no libyaml) on a deep document
        raise ManifestError(source, [Problem((), too_deep())]) from None
    except InputLimitError as exc:  # nesting or a number past its bound, somewhere in the file
        root = yaml.compose(text, Loader=_BASE_LOADER)
        problem = Problem(exc.path, exc.problem, _line_of(root, exc.path))
        raise ManifestError(source, [problem]) from None
    except _Refused as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise ManifestError(source, [Problem((), str(exc.problem), line)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise ManifestError(source, [Problem((), f"not valid YAML: {reason}", line)]) from None
    except yaml.YAMLError as exc:
        raise ManifestError(source, [Problem((), f"not valid YAML: {exc}")]) from None
    problems: list[Problem] = []
    manifest = _validate(data, settings, registry, problems)
    if problems:
        raise ManifestError(source, _with_lines(text, problems))
    assert manifest is not None
    return manifest


def _validate(
    data: Any, settings: Settings, registry: Registry, problems: list[Problem]
) -> Manifest | None:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        problems.append(Problem((), f"must be a mapping with keys {', '.join(TOP_KEYS)}"))
        return None
    for key in data:
        if key not in TOP_KEYS:
            problems.append(Problem((str(key),), f"unknown key (allowed: {', '.join(TOP_KEYS)})"))
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION or isinstance(version, bool):
        problems.append(Problem(("version",), f"must be {FORMAT_VERSION}, got {version!r}"))
    windows: list[Window] = []
    scopes: set[str] = set()
    notify = _Targets()
    tenants = _tenants(data.get("tenants"), settings, problems, windows, scopes, notify)
    checks = _checks(data.get("checks"), settings, registry, problems, windows, scopes, notify)
    return Manifest(
        tuple(checks),
        tenants,
        tuple(windows),
        frozenset(scopes),
        tuple(notify.targets),
        frozenset(notify.scopes),
    )


@dataclass
class _Targets:
    """The notification targets of the file as they are read."""

    targets: list[NotifyTarget] = field(default_factory=list)
    scopes: set[str] = field(default_factory=set)

    def read(self, raw: Any, owner: Mapping[str, str], at: Path, problems: list[Problem]) -> None:
        """Validate a ``notify`` list of URLs with the target store's own validator; ``owner``
        is ``{"uid": ...}`` or ``{"tenant": ...}``. A URL listed twice in one scope is refused."""
        scope = maintenance_scope(**owner)
        self.scopes.add(scope)
        if raw is None:
            return
        if not isinstance(raw, list):
            problems.append(Problem(at, "must be a list of notification URLs"))
            return
        seen: dict[str, int] = {}
        for index, url in enumerate(raw):
            here = (*at, index)
            if isinstance(url, str) and looks_masked(url):
                target = NotifyTarget("", scope, url.strip())  # resolved against the store
            else:
                try:
                    target = validate_target(**owner, url=url, target_id="file")
                except CheckFieldError as exc:
                    problems.append(Problem(here, exc.reason))
                    continue
            if target.url in seen:
                problems.append(
                    Problem(here, f"duplicate URL (also {_path_text(at)}[{seen[target.url]}])")
                )
                continue
            seen[target.url] = index
            self.targets.append(target)


def _tenants(
    raw: Any,
    settings: Settings,
    problems: list[Problem],
    windows: list[Window],
    scopes: set[str],
    notify: _Targets,
) -> dict[str, TenantSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(Problem(("tenants",), "must be a mapping of tenant name to its settings"))
        return {}
    out: dict[str, TenantSpec] = {}
    for name, spec in raw.items():
        at: Path = ("tenants", str(name))
        if not isinstance(name, str) or not is_tenant(name):
            problems.append(Problem(at, f"{name!r} is not a tenant name: use {TENANT_RULE}"))
            continue
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping):
            problems.append(Problem(at, f"must be a mapping with keys {', '.join(TENANT_KEYS)}"))
            continue
        for key in spec:
            if key not in TENANT_KEYS:
                allowed = ", ".join(TENANT_KEYS)
                problems.append(Problem((*at, str(key)), f"unknown key (allowed: {allowed})"))
        bucket = _rate_limit(name, spec.get("rate_limit"), (*at, "rate_limit"), problems)
        if "maintenance" in spec:
            scopes.add(maintenance_scope(tenant=name))
            owner = {"tenant": name}
            _windows(spec["maintenance"], owner, (*at, "maintenance"), settings, problems, windows)
        if "notify" in spec:
            notify.read(spec["notify"], {"tenant": name}, (*at, "notify"), problems)
        out[name] = TenantSpec(name, bucket)
    return out


def _rate_limit(
    tenant: str, raw: Any, at: Path, problems: list[Problem]
) -> tuple[float, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(Problem(at, "must be a mapping: {per_minute: N, burst: B}"))
        return None
    for key in raw:
        if key not in RATE_LIMIT_KEYS:
            allowed = ", ".join(RATE_LIMIT_KEYS)
            problems.append(Problem((*at, str(key)), f"unknown key (allowed: {allowed})"))
    per_minute = raw.get("per_minute")
    burst = raw.get("burst")
    if burst is None and isinstance(per_minute, int | float) and not isinstance(per_minute, bool):
        burst = default_burst(per_minute) if per_minute > 0 else per_minute
    try:
        return validate_rate_limit(tenant, per_minute, burst)
    except CheckFieldError as exc:
        problems.append(Problem((*at, exc.field), exc.reason))
        return None


def _seconds(value: Any) -> Any:
    """A text such as ``"1h30m"`` (d, h, m, s) as seconds; anything else as given (the range
    and the type are :func:`~celery_app.checks.maintenance.validate_window`'s to check)."""
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match and any(match.groups()):
            d, h, m, s = (int(x or 0) for x in match.groups())
            return ((d * 24 + h) * 60 + m) * 60 + s
    return value


def _windows(
    raw: Any,
    owner: Mapping[str, str],
    at: Path,
    settings: Settings,
    problems: list[Problem],
    out: list[Window],
) -> None:
    """Validate a ``maintenance`` list with the window store's own validator; ``owner`` is
    ``{"uid": ...}`` or ``{"tenant": ...}``. A window listed twice in one scope is refused."""
    if raw is None:
        return
    if not isinstance(raw, list):
        problems.append(Problem(at, "must be a list of {cron, duration, timezone}"))
        return
    seen: dict[tuple[str, int, str], int] = {}
    for index, item in enumerate(raw):
        here = (*at, index)
        if not isinstance(item, Mapping):
            problems.append(Problem(here, "must be a mapping {cron, duration, timezone}"))
            continue
        unknown = [str(key) for key in item if key not in WINDOW_KEYS]
        for key in unknown:
            allowed = ", ".join(WINDOW_KEYS)
            problems.append(Problem((*here, key), f"unknown key (allowed: {allowed})"))
        try:
            window = validate_window(
                **owner,
                cron=item.get("cron"),
                duration=_seconds(item.get("duration")),
                timezone=item.get("timezone", settings.timezone),
            )
        except CheckFieldError as exc:
            reason = exc.reason
            if exc.field == "duration":  # the file's own text, not the seconds it became
                reason = (
                    f"{reason.rsplit(', got', 1)[0]} {DURATION_TEXT}, got {item.get('duration')!r}"
                )
            problems.append(Problem((*here, exc.field), reason))
            continue
        if unknown:
            continue
        identity = (window.cron, window.duration_s, window.timezone)
        if identity in seen:
            first = f"{_path_text(at)}[{seen[identity]}]"
            problems.append(Problem(here, f"duplicate window (also {first})"))
            continue
        seen[identity] = index
        out.append(window)


def _checks(
    raw: Any,
    settings: Settings,
    registry: Registry,
    problems: list[Problem],
    windows: list[Window],
    scopes: set[str],
    notify: _Targets,
) -> list[CheckDefinition]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(Problem(("checks",), "must be a list of checks"))
        return []
    out: list[CheckDefinition] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw):
        at: Path = ("checks", index)
        if not isinstance(item, Mapping):
            problems.append(Problem(at, "must be a mapping with uid, tenant, kind, target, ..."))
            continue
        fields = {str(k): v for k, v in item.items()}
        uid = fields.get("uid") if isinstance(fields.get("uid"), str) else None
        has_windows = "maintenance" in fields
        check_windows = fields.pop("maintenance", None)
        has_targets = "notify" in fields
        check_targets = fields.pop("notify", None)
        try:
            defn = validate_definition(settings, registry=registry, **fields)
        except CheckFieldError as exc:
            path = tuple(exc.field.split(".", 1)) if exc.field else ()
            problems.append(Problem((*at, *path), exc.reason, uid=uid))
            continue
        if defn.uid in seen:
            first = seen[defn.uid]
            problems.append(
                Problem((*at, "uid"), f"duplicate uid (also checks[{first}])", uid=defn.uid)
            )
            continue
        seen[defn.uid] = index
        if has_windows:
            scopes.add(maintenance_scope(uid=defn.uid))
            _windows(
                check_windows, {"uid": defn.uid}, (*at, "maintenance"), settings, problems, windows
            )
        if has_targets:
            notify.read(check_targets, {"uid": defn.uid}, (*at, "notify"), problems)
        out.append(defn)
    return out


# --- where a problem is ------------------------------------------------------------------------


def _path_text(path: Path) -> str:
    return path_text("", path)


def _line_of(root: yaml.Node | None, path: Path) -> int | None:
    """The line of the deepest node of ``path`` in the composed tree (a key's own line)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _with_lines(text: str, problems: list[Problem]) -> list[Problem]:
    root = yaml.compose(text, Loader=_LOADER)
    return [
        Problem(p.path, p.message, _line_of(root, p.path) if p.line is None else p.line, p.uid)
        for p in problems
    ]
