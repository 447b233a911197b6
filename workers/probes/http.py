"""The ``http`` probe: one request (its transport: :mod:`workers.probes.http_exchange`), judged
by status code, body substring, and the rules of :mod:`workers.probes.http_judgement`
(certificate expiry, latency, regex, JSON path).

One :class:`~workers.deadline.Deadline` covers the run: resolution, every address tried, the TLS
handshake, each write and each read of every hop share it, so a server that drips its headers or
body a byte at a time is cut off at the deadline. The final body is read up to
:data:`MAX_BODY_BYTES` and the connection closed.

Every https result carries the final connection's certificate expiry in its detail
(``cert_not_after``, ``cert_days_left``), read from the TLS connection the request used.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import certifi
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_serializer, field_validator

from celery_app.checks.redaction import redact_target
from celery_app.errors import CheckFieldError
from workers.deadline import DeadlineExceeded, honours_deadline
from workers.probes import http_judgement as judge
from workers.probes.config import parse_config
from workers.probes.http_exchange import (
    BodyNotDecoded,
    RedirectRefused,
    TooManyRedirects,
    fetch,
)
from workers.probes.result import ProbeContext, ProbeResult
from workers.target_guard import (
    AddressPolicy,
    ResolutionFailed,
    TargetRefused,
    literal_address,
    vet_address,
)

#: The most body a probe reads to look for ``body_contains``: reading stops there and the
#: connection is closed, so the rest is not downloaded (the kernel may hold a few MB more).
MAX_BODY_BYTES = 1 << 20
USER_AGENT = "checkbeat-probe/1"
#: Sent on every request unless the check's headers set them (Host is written per hop).
DEFAULT_HEADERS = (
    ("Accept", "*/*"),
    ("Accept-Encoding", "gzip, deflate"),
    ("User-Agent", USER_AGENT),
)

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
#: ``redirect_headers``: whether the check's headers follow a redirect to another origin.
#: Why not by default: any header may carry a key (``X-Api-Key``, a custom one), and the origin
#: a redirect names is chosen by whoever answers the target.
RedirectHeaders = Literal["same-origin", "all"]

#: Bounds of an http check's config at write time (docs/security.md, "Limits"): far above what a
#: real check sends, low enough that one tenant's checks cost every worker little. The whole
#: config is bounded too (``celery_app.checks.definition.MAX_CONFIG_BYTES``).
MAX_HEADERS = 100
MAX_HEADER_NAME_CHARS = 256
MAX_HEADER_VALUE_CHARS = 8192
MAX_BODY_CONTAINS_CHARS = 8192
#: A field name is an RFC 9110 token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: What a field value may hold (RFC 9110 field-content: tab, space, visible ASCII, and obs-text,
#: which http.client sends as Latin-1): anything else, CR, LF and NUL first, fails every run.
_BAD_VALUE_CHAR = re.compile(r"[^\t\x20-\x7e\x80-\xff]")


def _header_problem(name: str, value: str) -> str | None:
    """Why header ``name: value`` cannot be sent (the value itself is never quoted: it may be a
    credential), or None."""
    shown = repr(name) if len(name) <= 40 else f"{name[:37]!r}..."
    if len(name) > MAX_HEADER_NAME_CHARS:
        return f"name {shown} is {len(name):,} characters; at most {MAX_HEADER_NAME_CHARS}"
    if not _TOKEN.fullmatch(name):
        return (
            f"name {shown} is not an HTTP field name (RFC 9110 token: letters, digits and "
            "!#$%&'*+-.^_`|~, no spaces or colons)"
        )
    if len(value) > MAX_HEADER_VALUE_CHARS:
        return (
            f"value of {shown} is {len(value):,} characters; "
            f"at most {MAX_HEADER_VALUE_CHARS:,} are allowed"
        )
    bad = _BAD_VALUE_CHAR.search(value)
    if bad is None:
        return None
    char = bad.group()
    if char in "\r\n":
        return (
            f"value of {shown} contains a line break (CR or LF), which HTTP does not allow; "
            "a YAML block scalar (|) ends in one: use |- or a quoted string"
        )
    what = "NUL" if char == "\0" else f"the character U+{ord(char):04X}"
    return (
        f"value of {shown} contains {what}; allowed: tab, space, visible ASCII and Latin-1 "
        "characters"
    )


class HttpConfig(BaseModel):
    """An ``http`` check's config (the URL is the check's target): what counts as up."""

    # hide_input_in_errors: a run that validates a stored config past a bound (an older version's
    # or a hand edit's) says why it is refused, and must not quote the config (its headers hold
    # credentials).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    method: Method = "GET"
    expected_status: tuple[int, ...] = Field(
        default=tuple(range(200, 400)), description="status codes that count as up"
    )
    body_contains: str | None = Field(None, description="substring the body must contain")
    headers: dict[str, str] = Field(default_factory=dict)
    follow_redirects: bool = True
    redirect_headers: RedirectHeaders = Field(
        "same-origin",
        description="which of the check's headers a redirect to another origin carries: "
        "'same-origin' (none: they stay with the target's origin) or 'all'",
    )
    tls_min_days: int | None = Field(
        None, ge=1, le=judge.MAX_TLS_MIN_DAYS, description="degraded below (https only)"
    )
    max_latency_ms: int | None = Field(
        None, ge=1, le=judge.MAX_LATENCY_MS, description="degraded above"
    )
    body_regex: str | None = Field(None, description="RE2 regex the body must match")
    json_path: str | None = Field(None, description="JMESPath into the JSON body")
    json_expected: JsonValue = Field(None, description="the value json_path must yield")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_HEADERS:
            raise ValueError(f"has {len(value):,} headers; at most {MAX_HEADERS} are allowed")
        seen: set[str] = set()
        for name, text in value.items():
            problem = _header_problem(name, text)
            if problem is not None:
                raise ValueError(problem)
            if name.lower() in seen:
                raise ValueError(f"name {name!r} appears twice (names are compared without case)")
            seen.add(name.lower())
        return value

    @field_validator("body_contains")
    @classmethod
    def _body_contains(cls, value: str | None) -> str | None:
        if value is not None and len(value) > MAX_BODY_CONTAINS_CHARS:
            raise ValueError(
                f"is {len(value):,} characters long; at most {MAX_BODY_CONTAINS_CHARS:,} "
                "are allowed"
            )
        return value

    @field_validator("body_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return None if value is None else judge.compile_body_regex(value)

    @field_validator("json_path")
    @classmethod
    def _json_path(cls, value: str | None) -> str | None:
        return None if value is None else judge.compile_json_path(value)

    @field_validator("json_expected")
    @classmethod
    def _json_expected(cls, value: Any) -> Any:
        return judge.check_json_expected(value)

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("expected_status", mode="before")
    @classmethod
    def _status_list(cls, value: Any) -> Any:
        """Accept ``200``, ``[200, 204]`` or class strings such as ``"2xx"``."""
        items = value if isinstance(value, list | tuple) else [value]
        codes: list[Any] = []
        for item in items:
            if isinstance(item, str) and len(item) == 3 and item[1:].lower() == "xx":
                if item[0] not in "12345":
                    raise ValueError(f"status class {item!r} must be 1xx..5xx")
                base = int(item[0]) * 100
                codes.extend(range(base, base + 100))
            else:
                codes.append(item)
        return tuple(codes)

    @field_validator("expected_status")
    @classmethod
    def _status_range(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("must list at least one status code")
        bad = [code for code in value if not 100 <= code <= 599]
        if bad:
            raise ValueError(f"status codes must be within 100..599, got {bad}")
        return tuple(sorted(set(value)))

    @field_serializer("expected_status")
    def _status_compact(self, value: tuple[int, ...]) -> list[int | str]:
        """Stored compactly: a whole class as ``"2xx"`` (the default is two classes, not 200
        codes in every check hash); validating it again gives the same codes."""
        return list(_compact_statuses(value))


@functools.lru_cache(maxsize=256)
def _compact_statuses(value: tuple[int, ...]) -> tuple[int | str, ...]:
    """``value`` with each whole class of 100 codes as its name (``"2xx"``), then the rest."""
    codes = set(value)
    classes: list[int | str] = []
    for base in range(100, 600, 100):
        block = set(range(base, base + 100))
        if block <= codes:
            classes.append(f"{base // 100}xx")
            codes -= block
    return (*classes, *sorted(codes))


def _reads_body(spec: HttpConfig) -> bool:
    """Whether any rule of ``spec`` looks at the body's text."""
    rules = (spec.body_contains, spec.body_regex, spec.json_path)
    return any(rule is not None for rule in rules)


def _spec(config: Mapping[str, Any]) -> HttpConfig:
    """``config`` validated, once per distinct config and process: the stored config lists
    status classes (``"2xx"``) that validation expands to every code, a tenth of a probe's
    CPU when done on every run. ValueError as :meth:`HttpConfig.model_validate` raises it."""
    try:
        key = json.dumps(config, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON: validate it as it is (and say why it fails)
        return HttpConfig.model_validate(dict(config))
    return _spec_of(key)


@functools.lru_cache(maxsize=1024)
def _spec_of(key: str) -> HttpConfig:
    return HttpConfig.model_validate(json.loads(key))


def check_url(target: str) -> str:
    """The target of an ``http`` check: an http(s) URL with a host (CheckFieldError if not)."""
    if not isinstance(target, str):
        raise CheckFieldError("target", f"must be a URL string, got {type(target).__name__}")
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https"):
        raise CheckFieldError(
            "target",
            f"must be a URL starting with http:// or https://, got {redact_target(target)!r}",
        )
    if not parts.hostname:
        raise CheckFieldError("target", f"must be a URL with a host, got {redact_target(target)!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise CheckFieldError("target", f"has an invalid port: {redact_target(target)!r}") from None
    return target


def validate_http_config(
    target: str, config: Mapping[str, Any], policy: AddressPolicy | None = None
) -> dict[str, Any]:
    """Validate an ``http`` check at creation; return its config normalised (JSON-ready).

    A literal private address (``http://10.0.0.1``) is refused here already when a policy is
    given; a name is only judged at run time, after resolution, because its answer may change.
    """
    check_url(target)
    parsed = parse_config("http", HttpConfig, config)
    if parsed.tls_min_days is not None and urlsplit(target).scheme != "https":
        raise CheckFieldError(
            "config.tls_min_days", "applies to https:// targets only (this one has no TLS)"
        )
    if parsed.json_path is not None and "json_expected" not in parsed.model_fields_set:
        raise CheckFieldError(
            "config.json_expected", "is required with json_path (the JSON value it must yield)"
        )
    if parsed.json_path is None and parsed.json_expected is not None:
        raise CheckFieldError(
            "config.json_path", "is required with json_expected (a JMESPath expression)"
        )
    if policy is not None:
        host = urlsplit(target).hostname or ""
        literal = literal_address(host)
        if literal is not None:
            try:
                vet_address(literal, host, policy)
            except TargetRefused as exc:
                raise CheckFieldError("target", str(exc)) from None
    return parsed.model_dump(mode="json")


@functools.cache
def tls_context(extra_ca_file: str | None) -> ssl.SSLContext:
    """One verifying TLS context per process (and extra CA file): loading the CA bundle costs
    more than most probes. ``extra_ca_file`` (CHECKBEAT_PROBE_TLS_CA_FILE) is trusted as well."""
    context = ssl.create_default_context(cafile=certifi.where())
    if extra_ca_file:
        context.load_verify_locations(cafile=extra_ca_file)
    return context


def classify_http_error(exc: BaseException) -> str:
    """The error class of an exception raised while requesting."""
    if isinstance(exc, ResolutionFailed):
        return "dns"
    if isinstance(exc, TargetRefused):
        return "refused"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, TooManyRedirects | RedirectRefused):
        return "status"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return "tls"
        cause = cause.__cause__ or cause.__context__
    return "connect"


def split_credentials(url: str) -> tuple[str, str | None]:
    """The URL without its ``user:password@`` part, and that part as a basic ``Authorization``
    header's value.

    Why: errors may quote the URL; a tenant's password must not reach the worker's log or the
    results history.
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit(parts._replace(netloc=hostport))
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return clean, f"Basic {token}"


def request_headers(spec: HttpConfig, authorization: str | None) -> list[tuple[str, str]]:
    """What a probe sends besides Host: the defaults, overridden by the check's own headers
    (names compared without case), and the URL's credentials unless the check sets its own."""
    headers = {name.lower(): (name, value) for name, value in DEFAULT_HEADERS}
    if authorization is not None:
        headers["authorization"] = ("Authorization", authorization)
    for name, value in spec.headers.items():
        headers[name.lower()] = (name, value)
    return list(headers.values())


def headers_elsewhere(spec: HttpConfig) -> list[tuple[str, str]]:
    """What a probe sends once a redirect has left the target's origin: the defaults, and the
    check's own headers only when its ``redirect_headers`` is ``all`` (the URL's credentials
    never: they belong to the URL's origin)."""
    if spec.redirect_headers == "all":
        return request_headers(spec, None)
    return list(DEFAULT_HEADERS)


@honours_deadline
def http_probe(target: str, config: Mapping[str, Any], context: ProbeContext) -> ProbeResult:
    """Request ``target`` once within the run's deadline; never raises (every failure is a
    result with its error class)."""
    deadline = context.run_deadline()
    try:
        url, authorization = split_credentials(check_url(target))
        spec = _spec(config)
    except ValueError as exc:
        return ProbeResult.down("error", f"invalid config: {exc}", 0.0)
    try:
        exchange = fetch(
            spec.method,
            url,
            request_headers(spec, authorization),
            elsewhere=headers_elsewhere(spec),
            follow_redirects=spec.follow_redirects,
            policy=context.policy,
            tls=tls_context(context.tls_ca_file),
            deadline=deadline,
        )
        try:
            cert = judge.cert_expiry(exchange.ssl_object, datetime.now(UTC))
            body = exchange.read_body(MAX_BODY_BYTES)
        except TimeoutError:
            return ProbeResult.down(
                "timeout",
                f"body not read within {context.timeout_s:g} s",
                deadline.elapsed_ms(),
                status_code=exchange.status_code,
            )
        finally:
            exchange.close()  # the unread rest is not downloaded
        latency = deadline.elapsed_ms()
    except SoftTimeLimitExceeded:
        raise  # the runner records the soft limit (prefork and gevent pools raise it here)
    except Exception as exc:  # a probe never raises: every failure is a result
        error_class = classify_http_error(exc)
        message = f"{type(exc).__name__}: {exc}"
        if error_class == "timeout":
            message = f"no answer within {context.timeout_s:g} s ({message})"
        return ProbeResult.down(error_class, message, deadline.elapsed_ms())
    if latency > context.timeout_s * 1000.0:
        return ProbeResult.down("timeout", f"no answer within {context.timeout_s:g} s", latency)
    status = exchange.status_code
    detail: dict[str, Any] = {"status_code": status, "address": str(exchange.address)}
    if cert is not None:
        detail.update(cert.detail())
    if status not in spec.expected_status:
        return ProbeResult.down("status", f"status {status} is not expected", latency, **detail)
    if _reads_body(spec):  # decoding costs a charset lookup per run: only when it is judged
        try:
            text = exchange.text(body, MAX_BODY_BYTES)
        except BodyNotDecoded as exc:
            return ProbeResult.down("body", f"body not decoded: {exc}", latency, **detail)
        if spec.body_contains is not None and spec.body_contains not in text:
            return ProbeResult.down(
                "body", f"body does not contain {spec.body_contains!r}", latency, **detail
            )
        try:
            failure = judge.body_failure(
                text,
                body_regex=spec.body_regex,
                json_path=spec.json_path,
                json_expected=spec.json_expected,
                truncated=len(body) >= MAX_BODY_BYTES or exchange.cut,
                deadline=deadline,
            )
        except DeadlineExceeded as exc:
            return ProbeResult.down("timeout", str(exc), deadline.elapsed_ms(), **detail)
        if deadline.expired:  # judging is part of the run: a verdict past its limit is late
            return ProbeResult.down(
                "timeout",
                f"the body was not judged within {context.timeout_s:g} s",
                deadline.elapsed_ms(),
                **detail,
            )
        if failure is not None:
            return ProbeResult.down("body", failure, latency, **detail)
    degraded = judge.degraded_reason(
        latency_ms=latency,
        max_latency_ms=spec.max_latency_ms,
        cert=cert,
        tls_min_days=spec.tls_min_days,
    )
    return ProbeResult.up(latency, degraded=degraded, **detail)
