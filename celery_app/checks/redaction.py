"""Secrets out of everything checkbeat shows or records: the one definition of what a check's
secrets are, how a definition is shown without them, and how a text is scrubbed of them.

Why: a tenant's check carries credentials (``https://user:pass@host/``, an ``Authorization`` or
``X-Api-Key`` header, ``?api_key=`` in the URL). The stored definition keeps the real values (the
probe needs them); everything else is read by operators, other tenants' dashboards, hooks and
tickets, so:

- **shown** (``checks add/list/show``, ``checks export`` without ``--include-secrets``, the diff
  of ``checks apply --dry-run``): :func:`redact_target`, :func:`redact_config` and
  :func:`redact_definition` replace each secret by :data:`MASK`;
- **recorded** (a run's error, degraded reason and detail, hence the results stream, the last
  result, transitions and the ``@on_transition`` payload): a probe or the library it calls may
  quote a secret in an exception (``Invalid header value b'Bearer <token>\\r\\n'``), so the
  result is scrubbed *by value* before it is built (:func:`check_secrets`, :func:`scrub`):
  every secret of the check's definition, in each form a text may quote it (as is, stripped,
  ``repr``/bytes-escaped, JSON-escaped, percent-encoded, the basic-auth token of URL
  credentials), is replaced by :data:`MASK`.

What a secret is (docs/security.md has the table of where each is masked):

- the password of a URL's userinfo (the user alone when there is no password; a user next to a
  password is shown, as for Redis URLs);
- the value of a query parameter named like a credential (:func:`is_credential_name`);
- every header value of the config (``headers``): a custom header may carry a key as well as
  ``Authorization`` does, and which header a server reads a key from is the server's choice;
- in any kind's config, the value of a key named like a credential (``password``, ``token``...).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit, urlunsplit

MASK = "***"
#: Shortest secret searched for in a text: shorter values would mask ordinary words of an
#: error message, and a credential is longer.
MIN_SECRET_CHARS = 4
#: Shortest word of a multi-word secret (``Bearer <token>``) searched for on its own: the
#: token may be quoted without its scheme word, which is shorter than this.
MIN_SECRET_WORD_CHARS = 8
#: Names (lower case, separators removed) that are credentials whole, or as the last part of a
#: name split at ``_``, ``-`` or ``.`` (``x_api_key``, ``X-Amz-Signature``).
CREDENTIAL_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "pwd",
        "pass",
        "signature",
        "sig",
        "auth",
        "authorization",
        "session",
        "sessionid",
        "credential",
        "credentials",
        "cookie",
    }
)
#: Endings that make a name a credential even when joined without a separator
#: (``accessToken``, ``clientsecret``): long enough not to end an ordinary word.
CREDENTIAL_ENDINGS = (
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "signature",
    "credential",
    "credentials",
    "sessionid",
    "authorization",
)
_SEPARATORS = re.compile(r"[_\-.\s]+")


def is_credential_name(name: str) -> bool:
    """Whether a query parameter or config key named ``name`` holds a credential (case and
    separators ignored: ``token``, ``api_key``, ``X-Api-Key``, ``accessToken``, ``sig``...)."""
    lowered = name.strip().lower()
    parts = [p for p in _SEPARATORS.split(lowered) if p]
    if not parts:
        return False
    joined = "".join(parts)
    return (
        parts[-1] in CREDENTIAL_WORDS
        or joined in CREDENTIAL_WORDS
        or joined.endswith(CREDENTIAL_ENDINGS)
    )


# --- shown: a definition without its secrets ----------------------------------------------------


def _userinfo_masked(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"


def _query_pairs(query: str) -> Iterator[tuple[str, str, str]]:
    """Each ``name=value`` piece of ``query`` as (piece, decoded name, raw value)."""
    for piece in query.split("&"):
        name, _, value = piece.partition("=")
        yield piece, unquote_plus(name), value


def redact_target(target: str) -> str:
    """``target`` with its URL password (or user-only credential) and the values of its
    credential-named query parameters replaced by :data:`MASK`; anything not a URL as it is."""
    if "://" not in target:
        return target
    try:
        parts = urlsplit(target)
    except ValueError:  # not parseable as a URL: hide everything after the scheme
        return f"{target.partition('://')[0]}://{MASK}"
    query = "&".join(
        f"{piece.partition('=')[0]}={MASK}" if "=" in piece and is_credential_name(name) else piece
        for piece, name, _ in _query_pairs(parts.query)
    )
    return urlunsplit(parts._replace(netloc=_userinfo_masked(parts.netloc), query=query))


def _masked_keys(value: Any) -> Any:
    """``value`` with every credential-named key's value (at any depth) replaced."""
    if isinstance(value, Mapping):
        return {
            k: MASK if is_credential_name(str(k)) and v is not None else _masked_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked_keys(v) for v in value]
    return value


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every header value and every credential-named key's value replaced."""
    out = _masked_keys(dict(config))
    headers = config.get("headers")
    if isinstance(headers, Mapping):
        out["headers"] = {name: MASK for name in headers}
    return out


def redact_definition(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``CheckDefinition.as_dict()`` with its target and config redacted."""
    out = dict(data)
    out["target"] = redact_target(str(out.get("target", "")))
    out["config"] = redact_config(out.get("config") or {})
    return out


_MARK = "CHECKBEATMASKMARK"


def holds_mask(target: str, config: Mapping[str, Any]) -> bool:
    """Whether :data:`MASK` is anywhere in ``target`` or ``config`` (a cheap first test: a file
    of 100,000 checks without a mask costs one walk of each config)."""
    if MASK in target:
        return True

    def walk(value: Any) -> bool:
        if isinstance(value, str):
            return value == MASK
        if isinstance(value, Mapping):
            return any(walk(v) for v in value.values())
        if isinstance(value, list | tuple):
            return any(walk(v) for v in value)
        return False

    return walk(config)


def is_masked_target(target: str) -> bool:
    """Whether ``target`` holds :data:`MASK` where :func:`redact_target` puts one (a redacted
    target, as ``checks export`` writes it, not one to probe)."""
    if MASK not in target:
        return False
    marked = target.replace(MASK, _MARK)
    return redact_target(marked).count(_MARK) < marked.count(_MARK)


def masked_paths(config: Mapping[str, Any]) -> list[str]:
    """Where ``config`` holds :data:`MASK` in a place :func:`redact_config` masks
    (``headers.X-Api-Key``, ``auth.password``): a redacted config, not one to probe."""
    found: list[str] = []

    def walk(given: Any, shown: Any, path: str) -> None:
        if isinstance(given, Mapping) and isinstance(shown, Mapping):
            for k, v in given.items():
                walk(v, shown.get(k), f"{path}.{k}" if path else str(k))
        elif isinstance(given, list) and isinstance(shown, list):
            for i, (v, s) in enumerate(zip(given, shown, strict=False)):
                walk(v, s, f"{path}[{i}]")
        elif given == MASK and shown == MASK:
            found.append(path)

    walk(config, redact_config(config), "")
    return found


def restore_masked(
    target: str, config: Mapping[str, Any], stored_target: str, stored_config: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A redacted definition (``target``, ``config``, as ``checks export`` writes them) with
    each :data:`MASK` that stands where the stored definition has a secret given that secret
    back: a masked export applied to the store it came from changes nothing. A mask with no
    stored secret behind it is left (:func:`masked_paths`, :func:`is_masked_target` find it)."""
    if target != stored_target and redact_target(stored_target) == target:
        target = stored_target

    def restore(given: Any, stored: Any, shown: Any) -> Any:
        if given == MASK and shown == MASK:
            return stored
        if isinstance(given, Mapping) and isinstance(stored, Mapping):
            shown = shown if isinstance(shown, Mapping) else {}
            return {
                k: restore(v, stored[k], shown.get(k)) if k in stored else v
                for k, v in given.items()
            }
        return given

    return target, restore(dict(config), stored_config, redact_config(stored_config))


# --- recorded: texts scrubbed of a check's secrets ----------------------------------------------


def _secret_values(target: str, config: Mapping[str, Any]) -> Iterator[str]:
    """The check's secrets as written in its definition (see the module doc)."""
    if "://" in target:
        try:
            parts = urlsplit(target)
        except ValueError:
            parts = None
        if parts is not None:
            if "@" in parts.netloc:
                userinfo = parts.netloc.rpartition("@")[0]
                user, colon, password = userinfo.partition(":")
                yield password if colon else user
                yield unquote(password if colon else user)
                token = f"{unquote(user)}:{unquote(password)}".encode()
                yield base64.b64encode(token).decode("ascii")  # the probe's basic auth
            for _piece, name, value in _query_pairs(parts.query):
                if is_credential_name(name):
                    yield value
                    yield unquote_plus(value)
    headers = config.get("headers")
    if isinstance(headers, Mapping):
        yield from (v for v in headers.values() if isinstance(v, str))
    yield from _credential_key_values(config)


def _credential_key_values(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_credential_name(str(k)) and isinstance(v, str | int) and not isinstance(v, bool):
                yield str(v)
            else:
                yield from _credential_key_values(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _credential_key_values(v)


def _forms(value: str) -> Iterator[str]:
    """Each way a text may quote ``value``."""
    for text in {value, value.strip()}:
        yield text
        yield repr(text)[1:-1]  # str repr: escapes \n, \r, quotes
        yield json.dumps(text)[1:-1]
        yield quote(text, safe="")
        yield quote_plus(text)
        for encoding in ("utf-8", "latin-1"):
            with contextlib.suppress(UnicodeEncodeError):
                yield repr(text.encode(encoding))[2:-1]  # bytes repr: b'...'
        for word in text.split():  # Bearer <token>: the token may be quoted alone
            if len(word) >= MIN_SECRET_WORD_CHARS and word != text:
                yield from _forms(word)


def check_secrets(target: str, config: Mapping[str, Any]) -> tuple[str, ...]:
    """Every form of every secret of a check (target and config), longest first: what
    :func:`scrub` replaces. Empty for a check without secrets."""
    found: set[str] = set()
    for value in _secret_values(target, config):
        if len(value.strip()) >= MIN_SECRET_CHARS:
            found.update(f for f in _forms(value) if len(f) >= MIN_SECRET_CHARS)
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


@functools.lru_cache(maxsize=8192)
def stored_check_secrets(target: str, config_text: str) -> tuple[str, ...]:
    """:func:`check_secrets` of a check as its hash stores it (the config as JSON text), once
    per distinct check and process: every run needs them for its result, and they change only
    with the check (its stored text is the key), so no run works out every form of every header
    value again."""
    try:
        config = json.loads(config_text or "{}")
    except ValueError:
        config = {}
    return check_secrets(target, config if isinstance(config, dict) else {})


@functools.lru_cache(maxsize=8192)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(s) for s in secrets))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every occurrence of each of ``secrets`` (:func:`check_secrets`) replaced
    by :data:`MASK`."""
    if not secrets or not text:
        return text
    return _pattern(secrets).sub(MASK, text)


def scrub_value(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (JSON-like: strings, numbers, lists, mappings) with every string, keys
    included, scrubbed."""
    if not secrets:
        return value
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, Mapping):
        return {scrub_value(k, secrets): scrub_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_value(v, secrets) for v in value]
    return value
