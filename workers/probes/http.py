"""The ``http`` probe: one request with httpx, judged by status code, body substring, and the
rules of :mod:`workers.probes.http_judgement` (certificate expiry, latency, regex, JSON path).

Why a custom network backend: httpx resolves names inside its connection pool, after our check
would have run, so a DNS server could answer with a public address to the guard and a private one
to the connect (rebinding). The backend below is the only place a name is resolved: it vets the
answers and connects to the vetted address, for the first request and every redirect alike.
Proxies from the environment are ignored for the same reason (a proxy would connect for us).

One :class:`~workers.deadline.Deadline` covers the run (httpx's timeout bounds each read, not the
request): the backend resolves within it, every address tried shares it, and every socket
operation of every connection (connect, TLS handshake, each write and each read) gets
``min(per-op timeout, remaining)``, so a server that drips its headers or body a byte at a time
is cut off at the deadline. Redirects are followed here, one hop at a time, so a redirect's body
is never read; the final body is read up to :data:`MAX_BODY_BYTES` and the connection closed.

Every https result carries the final connection's certificate expiry in its detail
(``cert_not_after``, ``cert_days_left``), read from the TLS connection the request used.
"""

from __future__ import annotations

import functools
import json
import ssl
import threading
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import certifi
import httpcore
import httpx
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_serializer, field_validator

from celery_app.errors import CheckFieldError
from workers.deadline import Deadline, DeadlineExceeded, honours_deadline
from workers.probes import http_judgement as judge
from workers.probes.config import parse_config
from workers.probes.result import ProbeContext, ProbeResult
from workers.target_guard import (
    AddressPolicy,
    ResolutionFailed,
    TargetRefused,
    literal_address,
    resolve_vetted,
    vet_address,
)

#: The most body a probe reads to look for ``body_contains``: reading stops there and the
#: connection is closed, so the rest is not downloaded (the kernel may hold a few MB more).
MAX_BODY_BYTES = 1 << 20
#: Largest piece handed to one socket write, so a stalled send cannot outlive the deadline.
WRITE_PIECE_BYTES = 16 * 1024
MAX_REDIRECTS = 5
USER_AGENT = "checkbeat-probe/1"

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class HttpConfig(BaseModel):
    """An ``http`` check's config (the URL is the check's target): what counts as up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method = "GET"
    expected_status: tuple[int, ...] = Field(
        default=tuple(range(200, 400)), description="status codes that count as up"
    )
    body_contains: str | None = Field(None, description="substring the body must contain")
    headers: dict[str, str] = Field(default_factory=dict)
    follow_redirects: bool = True
    tls_min_days: int | None = Field(
        None, ge=1, le=judge.MAX_TLS_MIN_DAYS, description="degraded below (https only)"
    )
    max_latency_ms: int | None = Field(
        None, ge=1, le=judge.MAX_LATENCY_MS, description="degraded above"
    )
    body_regex: str | None = Field(None, description="Python regex the body must match")
    json_path: str | None = Field(None, description="JMESPath into the JSON body")
    json_expected: JsonValue = Field(None, description="the value json_path must yield")

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
            "target", f"must be a URL starting with http:// or https://, got {target!r}"
        )
    if not parts.hostname:
        raise CheckFieldError("target", f"must be a URL with a host, got {target!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise CheckFieldError("target", f"has an invalid port: {target!r}") from None
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


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by the run's deadline as well."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def _bound(self, timeout: float | None, error: type[Exception], what: str) -> float:
        try:
            return self._deadline.bound(timeout, what=what)
        except DeadlineExceeded as exc:
            raise error(str(exc)) from None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget = self._bound(timeout, httpcore.ReadTimeout, "reading the response")
        return self._inner.read(max_bytes, budget)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_PIECE_BYTES):
            budget = self._bound(timeout, httpcore.WriteTimeout, "sending the request")
            self._inner.write(buffer[start : start + WRITE_PIECE_BYTES], budget)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        # CPython bounds a whole handshake by the socket timeout (not each recv of it).
        budget = self._bound(timeout, httpcore.ConnectTimeout, "the TLS handshake")
        tls = self._inner.start_tls(ssl_context, server_hostname, budget)
        return DeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class VettingNetworkBackend(httpcore.SyncBackend):
    """httpcore backend that resolves, vets and connects to the vetted address (see module doc),
    all within ``deadline``."""

    def __init__(self, policy: AddressPolicy, deadline: Deadline) -> None:
        self._policy = policy
        self._deadline = deadline
        self.connected: list[str] = []

    def begin(self, deadline: Deadline) -> None:
        """A new run on this backend: its deadline bounds every connection from now on."""
        self._deadline = deadline
        self.connected = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        deadline = self._deadline
        try:
            addresses = resolve_vetted(host, port, self._policy, deadline)
        except DeadlineExceeded as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        last_error: Exception | None = None
        tried = 0
        for address in addresses:
            if deadline.expired:
                break
            budget = deadline.bound(timeout, what=f"connecting to {host}")
            tried += 1
            try:
                stream = super().connect_tcp(
                    str(address), port, budget, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last_error = exc
                continue
            self.connected.append(str(address))
            return DeadlineStream(stream, deadline)
        if last_error is None or deadline.expired:
            raise httpcore.ConnectTimeout(
                f"no address of {host} answered within {deadline.timeout_s:g} s "
                f"(tried {tried} of {len(addresses)})"
            ) from last_error
        raise last_error


@functools.cache
def _tls_context(extra_ca_file: str | None = None) -> ssl.SSLContext:
    """One verifying TLS context per process (and extra CA file): loading the CA bundle costs
    ~20 ms a probe. ``extra_ca_file`` (CHECKBEAT_PROBE_TLS_CA_FILE) is trusted as well."""
    context = ssl.create_default_context(cafile=certifi.where())
    if extra_ca_file:
        context.load_verify_locations(cafile=extra_ca_file)
    return context


class VettingTransport(httpx.HTTPTransport):
    """httpx transport whose every connection goes through :class:`VettingNetworkBackend`."""

    def __init__(
        self, policy: AddressPolicy, deadline: Deadline, extra_ca_file: str | None = None
    ) -> None:
        # verify=<context>: httpx would otherwise load the CA bundle again (~20 ms CPU) per probe.
        tls = _tls_context(extra_ca_file)
        super().__init__(verify=tls, trust_env=False, retries=0)
        self.backend = VettingNetworkBackend(policy, deadline)
        # httpx has no public knob for the network backend, so the pool is rebuilt with one.
        self._pool = httpcore.ConnectionPool(
            ssl_context=tls,
            max_connections=4,
            max_keepalive_connections=0,
            retries=0,
            network_backend=self.backend,
        )


class _ThreadClient(threading.local):
    """One client and transport per thread and (policy, CA file), reused run after run.

    Why: building an httpx client, transport and pool per run was a tenth of the probe's CPU.
    What a run must not share with the previous one is reset: the deadline (the backend's,
    so every new connection gets this run's), the addresses connected and the cookie jar (a
    thread runs many tenants' checks). No connection outlives its run (the pool keeps none
    alive), and a run that raised drops the client, whatever state its pool was left in."""

    entry: tuple[tuple[AddressPolicy, str | None], httpx.Client, VettingTransport] | None = None

    def get(
        self, policy: AddressPolicy, extra_ca_file: str | None, deadline: Deadline
    ) -> tuple[httpx.Client, VettingTransport]:
        key = (policy, extra_ca_file)
        if self.entry is None or self.entry[0] != key:
            self.drop()
            transport = VettingTransport(policy, deadline, extra_ca_file)
            client = httpx.Client(transport=transport, follow_redirects=False, trust_env=False)
            self.entry = (key, client, transport)
        _, client, transport = self.entry
        transport.backend.begin(deadline)
        client.cookies.clear()
        return client, transport

    def drop(self) -> None:
        entry, self.entry = self.entry, None
        if entry is not None:
            entry[1].close()


_clients = _ThreadClient()


def classify_http_error(exc: BaseException) -> str:
    """The error class of an exception raised while requesting."""
    if isinstance(exc, ResolutionFailed):
        return "dns"
    if isinstance(exc, TargetRefused):
        return "refused"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(exc, httpx.TooManyRedirects):
        return "status"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return "tls"
        cause = cause.__cause__ or cause.__context__
    return "connect"


def split_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """The URL without its ``user:password@`` part, and that part as basic auth.

    Why: httpx logs every request URL (logger ``httpx``, INFO) and errors may quote it; a
    tenant's password must not reach the worker's log or the results history.
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit(parts._replace(netloc=hostport))
    return clean, httpx.BasicAuth(unquote(user), unquote(password))


def _send(
    client: httpx.Client,
    spec: HttpConfig,
    url: str,
    headers: Mapping[str, str],
    auth: httpx.BasicAuth | None,
    timeout: httpx.Timeout,
) -> httpx.Response:
    """Send the request, following redirects one hop at a time; a streaming response.

    httpx's own redirect handling reads each redirect's body to the end, whatever its size;
    here a redirect is closed unread. Same rules otherwise: httpx builds the next request (so
    credentials are dropped on a change of origin, and it keeps ``timeout``), at most
    :data:`MAX_REDIRECTS` hops.
    """
    request = client.build_request(spec.method, url, headers=headers, timeout=timeout)
    response = client.send(request, auth=auth, stream=True, follow_redirects=False)
    hops = 0
    while spec.follow_redirects and response.next_request is not None:
        response.close()
        hops += 1
        if hops > MAX_REDIRECTS:
            raise httpx.TooManyRedirects(
                "Exceeded maximum allowed redirects.", request=response.next_request
            )
        response = client.send(response.next_request, stream=True, follow_redirects=False)
    return response


def _peer_cert(response: httpx.Response) -> judge.CertExpiry | None:
    """The certificate expiry of the connection ``response`` came on (None without TLS)."""
    stream = response.extensions.get("network_stream")
    if stream is None:
        return None
    return judge.cert_expiry(stream.get_extra_info("ssl_object"), datetime.now(UTC))


def _read_body(response: httpx.Response, deadline: Deadline) -> bytes:
    """Up to :data:`MAX_BODY_BYTES` of the (decoded) body; stops there, the rest is not read.

    Each read is bounded by the deadline (the stream) and the deadline is checked between
    chunks, so a dripping body raises DeadlineExceeded.
    """
    body = bytearray()
    for chunk in response.iter_bytes():
        deadline.check("reading the body")
        body.extend(chunk[: MAX_BODY_BYTES - len(body)])
        if len(body) >= MAX_BODY_BYTES:
            break
    return bytes(body)


@honours_deadline
def http_probe(target: str, config: Mapping[str, Any], context: ProbeContext) -> ProbeResult:
    """Request ``target`` once within the run's deadline; never raises (every failure is a
    result with its error class)."""
    deadline = context.run_deadline()
    try:
        url, auth = split_credentials(check_url(target))
        spec = _spec(config)
    except ValueError as exc:
        return ProbeResult.down("error", f"invalid config: {exc}", 0.0)
    headers = {"User-Agent": USER_AGENT, **spec.headers}
    try:
        client, transport = _clients.get(context.policy, context.tls_ca_file, deadline)
        response = _send(client, spec, url, headers, auth, httpx.Timeout(context.timeout_s))
        cert = _peer_cert(response)
        try:
            body = _read_body(response, deadline)
        except (TimeoutError, httpx.TimeoutException):
            _clients.drop()
            return ProbeResult.down(
                "timeout",
                f"body not read within {context.timeout_s:g} s",
                deadline.elapsed_ms(),
                status_code=response.status_code,
            )
        finally:
            response.close()  # unread rest: httpcore closes the connection, not reused
        latency = deadline.elapsed_ms()
    except SoftTimeLimitExceeded:
        _clients.drop()
        raise  # the runner records the soft limit (prefork and gevent pools raise it here)
    except Exception as exc:  # a probe never raises: every failure is a result
        _clients.drop()
        error_class = classify_http_error(exc)
        message = f"{type(exc).__name__}: {exc}"
        if error_class == "timeout":
            message = f"no answer within {context.timeout_s:g} s ({message})"
        return ProbeResult.down(error_class, message, deadline.elapsed_ms())
    if latency > context.timeout_s * 1000.0:
        return ProbeResult.down("timeout", f"no answer within {context.timeout_s:g} s", latency)
    detail: dict[str, Any] = {"status_code": response.status_code}
    if transport.backend.connected:
        detail["address"] = transport.backend.connected[-1]
    if cert is not None:
        detail.update(cert.detail())
    if response.status_code not in spec.expected_status:
        return ProbeResult.down(
            "status", f"status {response.status_code} is not expected", latency, **detail
        )
    if _reads_body(spec):  # decoding costs a charset lookup per run: only when it is judged
        text = body.decode(response.encoding or "utf-8", errors="replace")
        if spec.body_contains is not None and spec.body_contains not in text:
            return ProbeResult.down(
                "body", f"body does not contain {spec.body_contains!r}", latency, **detail
            )
        failure = judge.body_failure(
            text,
            body_regex=spec.body_regex,
            json_path=spec.json_path,
            json_expected=spec.json_expected,
            truncated=len(body) >= MAX_BODY_BYTES,
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
