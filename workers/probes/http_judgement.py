"""What an ``http`` result is judged by beyond its status code: certificate expiry, latency,
the body (a regular expression) and a JSON assertion.

Why a module of its own: the same rules run twice, at write time (the config validator
compiles the regex and the JSON path, so a bad one is refused with its field named before
anything is stored) and at run time (the probe judges the response). Thresholds make a success
*degraded* (``tls_min_days``, ``max_latency_ms``); assertions on the body make it a failure.

The regex is RE2 syntax (``google-re2``: linear in the body, no backreferences or lookaround).
The JSON path is a JMESPath expression (``jmespath``, the library behind the AWS CLI's
``--query``), e.g. ``status``, ``checks[0].state`` or ``length(items)``. At run time both are
bounded by the run's deadline and by size caps (:mod:`workers.probes.bounded`).
"""

from __future__ import annotations

import json
import math
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jmespath.exceptions

from workers.deadline import Deadline
from workers.probes import bounded

#: Bounds of the judgement fields (inclusive).
MAX_TLS_MIN_DAYS = 3650
MAX_LATENCY_MS = 600_000
MAX_BODY_REGEX_CHARS = 1024
MAX_JSON_PATH_CHARS = 512
MAX_JSON_EXPECTED_CHARS = 4096


# --- at write time -----------------------------------------------------------------------------


def compile_body_regex(pattern: str) -> str:
    """``pattern`` if it is an RE2 regular expression of bounded length and program size
    (ValueError if not)."""
    if not pattern:
        raise ValueError("must be a non-empty regular expression")
    if len(pattern) > MAX_BODY_REGEX_CHARS:
        raise ValueError(
            f"is {len(pattern)} characters long; at most {MAX_BODY_REGEX_CHARS} are allowed"
        )
    bounded.compile_regex(pattern)
    return pattern


def compile_json_path(path: str) -> str:
    """``path`` if it is a JMESPath expression of bounded length (ValueError if not)."""
    if not path.strip():
        raise ValueError("must be a non-empty JMESPath expression, e.g. 'status' or 'items[0].ok'")
    if len(path) > MAX_JSON_PATH_CHARS:
        raise ValueError(
            f"is {len(path)} characters long; at most {MAX_JSON_PATH_CHARS} are allowed"
        )
    try:
        bounded.compile_json_path(path)
    except jmespath.exceptions.JMESPathError as exc:
        message = " ".join(str(exc).split())
        raise ValueError(f"is not a valid JMESPath expression: {message}") from None
    return path


def check_json_expected(value: Any) -> Any:
    """``value`` if it is a JSON value (no NaN or infinity) of bounded size (ValueError if not)."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be a JSON value: {exc}") from None
    if len(text) > MAX_JSON_EXPECTED_CHARS:
        raise ValueError(
            f"is {len(text)} characters as JSON; at most {MAX_JSON_EXPECTED_CHARS} are allowed"
        )
    return value


# --- at run time ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertExpiry:
    """The peer certificate's end of validity, as seen by the probe's TLS connection."""

    not_after: datetime
    days_left: float

    def detail(self) -> dict[str, Any]:
        return {
            "cert_not_after": self.not_after.isoformat(),
            "cert_days_left": round(self.days_left, 3),
        }


def cert_expiry(ssl_object: Any, now: datetime) -> CertExpiry | None:
    """The expiry of the certificate ``ssl_object`` (an ``ssl.SSLObject``/``SSLSocket``) was
    verified with, or None (no TLS, or no certificate to read)."""
    if ssl_object is None:
        return None
    try:
        cert = ssl_object.getpeercert()
    except (ValueError, ssl.SSLError):  # handshake not done
        return None
    text = (cert or {}).get("notAfter")
    if not text:
        return None
    not_after = datetime.fromtimestamp(ssl.cert_time_to_seconds(text), UTC)
    return CertExpiry(not_after, (not_after - now).total_seconds() / 86400.0)


def degraded_reason(
    *,
    latency_ms: float,
    max_latency_ms: int | None,
    cert: CertExpiry | None,
    tls_min_days: int | None,
) -> str | None:
    """Why a successful result is degraded (every crossed threshold, ``; ``-joined), or None."""
    reasons = []
    if tls_min_days is not None and cert is not None and cert.days_left < tls_min_days:
        left = math.floor(cert.days_left)
        reasons.append(f"tls_min_days: {left} days left < {tls_min_days}")
    if max_latency_ms is not None and latency_ms > max_latency_ms:
        reasons.append(f"max_latency_ms: {latency_ms:.0f} > {max_latency_ms}")
    return "; ".join(reasons) or None


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as JSON in at most ``limit`` characters, rendered piece by piece: a value the
    expression built may share its parts, so its full text can be far larger than its memory."""
    encoder = json.JSONEncoder(ensure_ascii=False, default=str)
    text = ""
    try:
        for piece in encoder.iterencode(value):
            text += piece
            if len(text) > limit:
                break
    except RecursionError:
        text += "..." * limit
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` (Python's ``True == 1``), ``1`` is ``1.0``."""
    return bounded.bounded_equal(a, b, bounded.Steps(None))


def body_failure(
    text: str,
    *,
    body_regex: str | None,
    json_path: str | None,
    json_expected: Any,
    truncated: bool,
    deadline: Deadline,
) -> str | None:
    """Why the body fails its assertions (the error of a ``body`` failure), or None.

    ``text`` is the body as read (at most the probe's body cap; ``truncated`` says it was cut
    there, which the message mentions: the match may lie beyond it, and a cut JSON document
    does not parse). Every step is bounded (:mod:`workers.probes.bounded`): a broken bound is
    a failure saying which; DeadlineExceeded when the run's deadline passes while judging.
    """
    cut = " (only the first 1 MiB is read)" if truncated else ""
    if body_regex is not None and not bounded.regex_search(body_regex, text, deadline):
        return f"body does not match body_regex {body_regex!r}{cut}"
    if json_path is None:
        return None
    try:
        document = bounded.parse_json(text)
    except bounded.BodyRuleBroken as exc:
        return f"{exc}, so json_path {json_path!r} cannot be checked"
    except ValueError as exc:
        return f"body is not JSON, so json_path {json_path!r} cannot be checked: {exc}{cut}"
    try:
        found, steps = bounded.json_path_search(json_path, document, deadline)
        if bounded.bounded_equal(found, json_expected, steps):
            return None
    except bounded.BodyRuleBroken as exc:
        return str(exc)
    return f"json_path {json_path!r} is {_shown(found)}, expected {_shown(json_expected)}"
