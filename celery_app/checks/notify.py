"""Notification targets of a check or of a tenant: URLs that every transition of the check is
sent to, by the same exactly-once delivery as the ``@on_transition`` hooks (docs/notifications.md).

A target is a URL. Every scheme Apprise knows (``slack://``, ``msteams://``, ``discord://``,
``tgram://``, ``mailto://``, ``json://``, ...) is sent by Apprise; ``checkbeat+webhook://`` and
``checkbeat+webhooks://`` are checkbeat's own signed JSON webhook (HMAC-SHA256 over the
timestamp and the exact body, ``?secret=`` in the URL), because Apprise's ``json://`` sends no
signature a receiver could verify. A URL is valid when Apprise parses it (or, for the signed
webhook, when it has a host and a secret of at least :data:`MIN_WEBHOOK_SECRET` characters).

Targets are stored per scope (``Keys.notify_targets(scope)``, scope ``check:<uid>`` or
``tenant:<tenant>``, the scopes of maintenance windows) in the first partition of the check
half (the store maintenance windows share: ``checks/scoped_store.py``): a tenant's targets
belong to no one check, and the delivery reads them outside the transition scripts, once per
delivery.

Shown (``checks notify list``, ``checks export`` without ``--include-secrets``, the outcome
records of ``checks transitions``), a URL is :func:`shown_url`: Apprise's own privacy form
(it knows which path part of each service is a token) with checkbeat's redaction on top (URL
passwords, credential-named query values and headers). The sending code is
``notify_send.py``; what is recorded here of each send is scrubbed by value of the target's
secrets (:func:`target_secrets`).
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from celery_app.checks.redaction import MASK, check_secrets, redact_target, scrub
from celery_app.checks.scoped_store import ScopedKind, ScopedStore, validated_id, validated_scope
from celery_app.errors import CheckFieldError
from celery_app.names import refused_characters
from celery_app.redis.schema import HOOKS_DONE, NOTIFY_RECORD_TTL_S, Keys, NotifyOutcomeField

#: The schemes of checkbeat's own signed JSON webhook (plain HTTP and HTTPS).
WEBHOOK_SCHEMES = {"checkbeat+webhook": "http", "checkbeat+webhooks": "https"}
#: Shortest signing secret of a signed webhook (``?secret=``).
MIN_WEBHOOK_SECRET = 16
#: Longest target URL.
MAX_URL = 2048
#: Longest error text recorded per target.
MAX_ERROR = 500
#: Apprise's privacy form shortens a token to its first and last character around ``...``.
_ELLIPSIS = re.compile(r"[^/:@?&=.]\.\.\.[^/:@?&=.]")


@dataclass(frozen=True)
class NotifyTarget:
    """One notification target (build it with :func:`validate_target`)."""

    id: str
    scope: str
    url: str

    @property
    def signed(self) -> bool:
        return self.url.split("://", 1)[0].lower() in WEBHOOK_SCHEMES

    @property
    def shown(self) -> str:
        return shown_url(self.url)

    def as_dict(self, *, include_secrets: bool = False) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "url": self.url if include_secrets else self.shown,
        }

    def to_json(self) -> str:
        return json.dumps({"url": self.url}, separators=(",", ":"))

    @classmethod
    def from_json(cls, target_id: str, scope: str, text: str) -> NotifyTarget:
        return cls(target_id, scope, json.loads(text)["url"])


# --- validation -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def quiet_apprise() -> None:
    """Keep Apprise's log lines out of the process's log (and off stderr, where Python prints
    an unconfigured logger's warnings): they may quote a URL and its token. What checkbeat
    says about a target, it says itself, masked."""
    import logging

    logging.getLogger("apprise").propagate = False


def _apprise_plugin(url: str) -> Any:
    """Apprise's plugin for ``url`` or None (Apprise is imported here, on first use: most
    processes never parse a target)."""
    import apprise

    quiet_apprise()
    with apprise.LogCapture(level=apprise.logging.ERROR):  # its parse errors quote the URL
        return apprise.Apprise.instantiate(url, suppress_exceptions=True)


def webhook_parts(url: str) -> tuple[str, str]:
    """(the http(s) URL to POST to, the signing secret) of a signed webhook URL; ValueError
    naming what is missing."""
    parts = urlsplit(url)
    scheme = WEBHOOK_SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"the scheme must be one of {', '.join(WEBHOOK_SCHEMES)}")
    if not parts.hostname:
        raise ValueError("needs a host, e.g. checkbeat+webhooks://example.com/hook?secret=...")
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = next((v for k, v in query if k == "secret"), "")
    if len(secret) < MIN_WEBHOOK_SECRET:
        raise ValueError(
            f"needs ?secret= of at least {MIN_WEBHOOK_SECRET} characters (the HMAC key the "
            "receiver verifies the signature with)"
        )
    rest = "&".join(f"{k}={v}" for k, v in query if k != "secret")
    post = parts._replace(scheme=scheme, query=rest).geturl()
    return post, secret


def validate_target(
    *,
    uid: str | None = None,
    tenant: str | None = None,
    url: Any,
    target_id: str | None = None,
) -> NotifyTarget:
    """A valid target, or CheckFieldError naming the field (uid/tenant, url, id) and what is
    allowed. Nothing of a refused URL is quoted back but its scheme (it may carry a token)."""
    scope = validated_scope(uid, tenant)
    if not isinstance(url, str) or "://" not in url:
        raise CheckFieldError(
            "url",
            "must be a notification URL such as slack://..., mailto://..., json://host/path "
            "or checkbeat+webhooks://host/path?secret=... (docs/notifications.md)",
        )
    url = url.strip()
    if len(url) > MAX_URL:
        raise CheckFieldError("url", f"must be at most {MAX_URL} characters, got {len(url)}")
    if bad := refused_characters(url) or [c for c in url if c.isspace()]:
        raise CheckFieldError("url", f"must not contain {', '.join(map(repr, bad))}")
    if looks_masked(url):
        raise CheckFieldError(
            "url",
            f"holds {MASK!r} or a token shortened to 'a...z', as `checks notify list` and "
            "`checks export` show a URL: give the URL itself",
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme in WEBHOOK_SCHEMES:
        try:
            webhook_parts(url)
        except ValueError as exc:
            raise CheckFieldError("url", f"{scheme}:// {exc}") from None
    elif _apprise_plugin(url) is None:
        raise CheckFieldError(
            "url",
            f"Apprise cannot use this {scheme}:// URL (an unknown scheme or a part missing; "
            "the URL forms: https://github.com/caronc/apprise/wiki)",
        )
    return NotifyTarget(validated_id(target_id), scope, url)


# --- secrets: shown and scrubbed -------------------------------------------------------------


@lru_cache(maxsize=4096)
def shown_url(url: str) -> str:
    """``url`` without its secrets: Apprise's privacy form (tokens in the path shortened to
    ``a...z``; of its query, only the parameters ``url`` gives), then URL passwords,
    credential-named query values, custom header values (``+Header=value``) and path segments
    that look like tokens (:func:`_token_like`) as :data:`MASK`."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in WEBHOOK_SCHEMES:
        plugin = _apprise_plugin(url)
        if plugin is None:
            return f"{scheme}://{MASK}"
        given = {unquote(piece.partition("=")[0]) for piece in urlsplit(url).query.split("&")}
        parts = urlsplit(plugin.url(privacy=True))
        query = "&".join(
            piece
            for piece in parts.query.split("&")
            if piece and unquote(piece.partition("=")[0]) in given
        )
        url = parts._replace(query=query).geturl()
    parts = urlsplit(redact_target(url))
    path = "/".join(MASK if _token_like(seg) else seg for seg in parts.path.split("/"))
    # Apprise writes custom headers as %2BName=value: every header value is masked, as the
    # http kind's headers are
    query = re.sub(r"((?:^|&)(?:%2B|\+)[^=&]*=)[^&]*", rf"\g<1>{MASK}", parts.query)
    return parts._replace(path=path, query=query).geturl()


def _token_like(segment: str) -> bool:
    """Whether a path segment of a webhook URL is likely a credential (``/hooks/<token>``):
    long, or mixing letters and digits; an e-mail address (a recipient) is not one. Service
    tokens Apprise knows are already shortened."""
    text = unquote(segment)
    if "@" in text:
        return False
    if len(text) >= 16:
        return True
    return len(text) >= 8 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)


def looks_masked(url: str) -> bool:
    """Whether ``url`` is a shown (masked) URL rather than one to send to."""
    return MASK in url or _ELLIPSIS.search(url) is not None


@lru_cache(maxsize=4096)
def target_secrets(url: str) -> tuple[str, ...]:
    """Every value of ``url`` that may be a secret, in each form a text may quote it: the
    userinfo, each path segment and query value, and the host when it is not a host name
    (``tgram://<bot token>/...``, ``discord://<webhook id>/...``). Longest first, for
    :func:`~celery_app.checks.redaction.scrub`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return (url,)
    values = [seg for seg in parts.path.split("/") if seg]
    values += [v for _k, v in parse_qsl(parts.query, keep_blank_values=True)]
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        values += [p for p in userinfo.split(":") if p]
    host = parts.netloc.rpartition("@")[2]
    if host and "." not in host and not host.startswith(("localhost", "[")):
        values.append(host)
    found = set(check_secrets(url, {}))
    for value in values:
        for form in {value, unquote(value)}:
            if len(form) >= 4:
                found.add(form)
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def scrubbed_error(text: str, target: NotifyTarget) -> str:
    """A failure's text fit to record: without the target's secrets, on one line, bounded."""
    line = " ".join(scrub(text, target_secrets(target.url)).split())
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."


# --- the store --------------------------------------------------------------------------------


class NotifyStore(ScopedStore[NotifyTarget]):
    """Add, remove and list targets; read the targets a check's transitions go to (the
    delivery reads them once per delivery: no version to cache them by)."""

    kind = ScopedKind(Keys.notify_targets, Keys.notify_scopes, NotifyTarget.from_json)


# --- the record of each delivery --------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How sending one transition to one target went so far."""

    target: str  # shown URL
    scope: str
    ok: bool
    at: float
    attempts: int
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            NotifyOutcomeField.TARGET: self.target,
            NotifyOutcomeField.SCOPE: self.scope,
            NotifyOutcomeField.OK: self.ok,
            NotifyOutcomeField.AT: self.at,
            NotifyOutcomeField.ATTEMPTS: self.attempts,
        }
        if self.error is not None:
            out[NotifyOutcomeField.ERROR] = self.error
        return out

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        return cls(
            target=str(data.get(NotifyOutcomeField.TARGET, "")),
            scope=str(data.get(NotifyOutcomeField.SCOPE, "")),
            ok=bool(data.get(NotifyOutcomeField.OK)),
            at=float(data.get(NotifyOutcomeField.AT) or 0.0),
            attempts=int(data.get(NotifyOutcomeField.ATTEMPTS) or 0),
            error=data.get(NotifyOutcomeField.ERROR),
        )


def read_outcomes(client: Any, keys: Keys, transition_id: str) -> dict[str, Outcome]:
    """Target id -> its outcome for this transition (the hooks' marker left out)."""
    raw = cast("dict[str, str]", client.hgetall(keys.notify_outcomes(transition_id)))
    return {tid: Outcome.from_json(text) for tid, text in raw.items() if tid != HOOKS_DONE}


def hooks_done(client: Any, keys: Keys, transition_id: str) -> bool:
    return bool(client.hexists(keys.notify_outcomes(transition_id), HOOKS_DONE))


def record_outcome(
    client: Any, keys: Keys, transition_id: str, target_id: str, outcome: Outcome
) -> None:
    _record(client, keys, transition_id, target_id, json.dumps(outcome.as_dict()))


def record_hooks_done(client: Any, keys: Keys, transition_id: str, now: float) -> None:
    _record(client, keys, transition_id, HOOKS_DONE, f"{now:.3f}")


def _record(client: Any, keys: Keys, transition_id: str, field: str, value: str) -> None:
    key = keys.notify_outcomes(transition_id)
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, field, value)
    pipe.expire(key, NOTIFY_RECORD_TTL_S)
    pipe.execute()


def outcomes_of(client: Any, keys: Keys, transition_ids: Iterable[str]) -> list[list[Outcome]]:
    """The outcomes of each transition (in order), one round trip (``checks transitions``)."""
    ids = builtins.list(transition_ids)
    pipe = client.pipeline(transaction=False)
    for tid in ids:
        pipe.hgetall(keys.notify_outcomes(tid))
    return [
        [Outcome.from_json(text) for f, text in sorted(raw.items()) if f != HOOKS_DONE]
        for raw in pipe.execute()
    ]


# --- what is sent -----------------------------------------------------------------------------


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def message(transition: Any) -> tuple[str, str]:
    """(title, body) of a transition's notification: the check, its tenant, from -> to, when,
    and each region's state and last error (already scrubbed of the check's secrets)."""
    held = " (held by maintenance until now)" if transition.held else ""
    title = f"[checkbeat] {transition.uid} ({transition.tenant}) is {transition.to_state}"
    lines = [
        f"{transition.uid} [{transition.tenant}]: {transition.from_state} -> "
        f"{transition.to_state}{held} at {_when(transition.at)}",
    ]
    for region, info in sorted(transition.regions.items()):
        state = info.get("state", "?") if isinstance(info, Mapping) else "?"
        result = info.get("result") if isinstance(info, Mapping) else None
        error = ""
        if isinstance(result, str):
            try:
                result = json.loads(result)
            except ValueError:
                result = None
        if isinstance(result, Mapping) and (result.get("error") or result.get("error_class")):
            error = f": {result.get('error') or result.get('error_class')}"
        lines.append(f"  {region}: {state}{error}")
    lines.append(f"transition {transition.id}")
    return title, "\n".join(lines)
