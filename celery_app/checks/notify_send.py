"""Sending a transition to a notification target (``celery_app/checks/notify.py`` has the
targets, their validation and the record of each send): the delivery task
(``workers/deliver_transition.py``) sends every transition, ``checks notify test`` one made up.

Apprise sends every URL it knows; ``checkbeat+webhook(s)://`` is sent here, signed: the body is
the transition's JSON (with ``title`` and ``message``), and the headers carry
``X-Checkbeat-Timestamp`` (Unix s) and ``X-Checkbeat-Signature: sha256=<hex>``, the HMAC-SHA256
of ``<timestamp>.<body>`` under the URL's secret, so a receiver verifies both the body and when
it was signed (a replayed request carries an old timestamp it cannot re-sign).

Apprise's own log lines are kept out of the worker's log (they may quote a URL and its token):
each send's failure is captured, scrubbed of the target's secrets, recorded and logged by the
delivery task.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import ssl
import time
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from celery_app.checks.notify import NotifyTarget, message, quiet_apprise, webhook_parts

#: Headers of a signed webhook request.
SIGNATURE_HEADER = "X-Checkbeat-Signature"
TIMESTAMP_HEADER = "X-Checkbeat-Timestamp"
DELIVERY_HEADER = "X-Checkbeat-Transition"
#: Bytes of a receiver's answer read (for the error of a refused send).
MAX_ANSWER = 300


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Checkbeat-Signature`` value of ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def webhook_body(transition: Any, payload: str) -> bytes:
    """The signed webhook's body: the transition as delivered, with the notification's text."""
    title, text = message(transition)
    data = json.loads(payload)
    data.update({"title": title, "message": text})
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


@lru_cache(maxsize=1)
def _tls() -> ssl.SSLContext:
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _send_signed(target: NotifyTarget, transition: Any, payload: str, timeout: float) -> None:
    post_url, secret = webhook_parts(target.url)
    body = webhook_body(transition, payload)
    timestamp = str(int(time.time()))
    parts = urlsplit(post_url)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=_tls()
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "checkbeat",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: signature(secret, timestamp, body),
                DELIVERY_HEADER: transition.id,
            },
        )
        answer = connection.getresponse()
        text = answer.read(MAX_ANSWER).decode("utf-8", "replace")
    finally:
        connection.close()
    if not 200 <= answer.status < 300:  # a redirect is not followed: the body is signed for here
        raise RuntimeError(f"HTTP {answer.status} {answer.reason}: {text}".strip())


def _send_apprise(target: NotifyTarget, transition: Any) -> None:
    import apprise

    quiet_apprise()
    title, body = message(transition)
    sender = apprise.Apprise()
    with apprise.LogCapture(level=apprise.logging.WARNING, fmt="%(message)s") as logs:
        if not sender.add(target.url):
            raise RuntimeError("Apprise cannot use this URL any more")
        ok = sender.notify(title=title, body=body)
        captured = logs.getvalue()
    if not ok:
        raise RuntimeError(" ".join(captured.split()) or "Apprise reported a failed send")


def send(target: NotifyTarget, transition: Any, payload: str, timeout: float) -> None:
    """Send ``transition`` to ``target``; raises with what went wrong (its text may quote the
    target's secrets: the caller scrubs it before recording or logging it)."""
    if target.signed:
        _send_signed(target, transition, payload, timeout)
    else:
        _send_apprise(target, transition)
