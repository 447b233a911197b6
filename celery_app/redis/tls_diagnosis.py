"""Why a TLS connection to Redis failed, in terms of the setting to change.

Why a probe: redis-py keeps the certificate error of a ``rediss://`` connection (as the
exception's context), but a Sentinel client only says ``No master found`` after trying every
Sentinel, the TLS reason gone. So when a connection over TLS fails, :func:`certificate_problem`
looks at the chain first and else makes one TLS handshake to each address of the URL with the
same options, and names ``CHECKBEAT_REDIS_TLS_CA_FILE`` if the server's certificate does not
verify. Only called on the error path (the CLI's one-line error).
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

from celery_app.cluster_url import is_cluster_url, parse_cluster_url
from celery_app.redis.sentinel import is_sentinel_url, parse_sentinel_url
from celery_app.redis.tls import CERT_REQS, is_tls_url
from celery_app.settings import Settings

PROBE_TIMEOUT_S = 1.0


def _verify_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    while exc is not None:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _addresses(url: str, settings: Settings) -> list[tuple[str, int]]:
    """The TLS endpoints of ``url`` ([] when it does not use TLS)."""
    if is_sentinel_url(url):
        return list(parse_sentinel_url(url).hosts) if settings.redis_sentinel_tls else []
    if is_cluster_url(url):
        parsed = parse_cluster_url(url)
        return list(parsed.nodes) if parsed.tls else []
    if not is_tls_url(url):
        return []
    parts = urlsplit(url)
    return [(parts.hostname or "127.0.0.1", parts.port or 6379)]


def _context(settings: Settings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=settings.redis_tls_ca_file)
    context.verify_mode = CERT_REQS[settings.redis_tls_cert_reqs]
    context.check_hostname = context.verify_mode == ssl.CERT_REQUIRED
    if settings.redis_tls_certfile:
        context.load_cert_chain(settings.redis_tls_certfile, settings.redis_tls_keyfile)
    return context


def _handshake(
    host: str, port: int, context: ssl.SSLContext
) -> ssl.SSLCertVerificationError | None:
    try:
        with (
            socket.create_connection((host, port), PROBE_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return exc
    except OSError:
        return None  # not a certificate problem (down, refused): the caller's reason stands


def certificate_problem(exc: BaseException, url: str, settings: Settings) -> str | None:
    """``"<host:port>'s TLS certificate did not verify (...) against <CA>; set ..."`` or None."""
    addresses = _addresses(url, settings)
    if not addresses:
        return None
    found = _verify_error(exc)
    where = f"{addresses[0][0]}:{addresses[0][1]}"
    if found is None:
        context = _context(settings)
        for host, port in addresses:
            found = _handshake(host, port, context)
            if found is not None:
                where = f"{host}:{port}"
                break
    if found is None:
        return None
    reason = found.verify_message or found.reason or str(found)
    ca = settings.redis_tls_ca_file
    against = f"CHECKBEAT_REDIS_TLS_CA_FILE={ca}" if ca else "the system CA bundle"
    return (
        f"the TLS certificate of {where} did not verify ({reason}) against {against}; set "
        "CHECKBEAT_REDIS_TLS_CA_FILE to the CA that signed it"
    )
