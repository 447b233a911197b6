"""TLS options for ``rediss://`` URLs, verified by default, for every Redis client checkbeat
opens: the state client (redis-py), the batch publisher (redis-py) and Celery's broker (kombu).

Why: kombu, given a ``rediss://`` broker URL without ``broker_use_ssl``, warns and connects
with ``ssl_cert_reqs=CERT_NONE`` (kombu/connection.py), which encrypts but accepts any
certificate, so a man in the middle reads the broker's messages. checkbeat always passes
explicit options built from ``CHECKBEAT_REDIS_TLS_*`` (default: certificate required, system CA
bundle unless ``CHECKBEAT_REDIS_TLS_CA_FILE``); turning verification off takes an explicit
``CHECKBEAT_REDIS_TLS_CERT_REQS=none``.
"""

from __future__ import annotations

import ssl
from typing import Any

from celery_app.redis.sentinel import is_sentinel_url, sentinel_tls_kwargs
from celery_app.settings import Settings

CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def is_tls_url(url: str | None) -> bool:
    if not url:
        return False
    return url.split("://", 1)[0].lower() == "rediss"


def redis_tls_kwargs(url: str, settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``redis.Redis.from_url(url, ...)``: {} for plain ``redis://``."""
    if not is_tls_url(url):
        return {}
    options = tls_options(settings)
    del options["ssl"]  # from_url reads it from the scheme
    return options


def tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py TLS keyword arguments from the ``redis_tls_*`` settings (a cluster's nodes)."""
    options: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": settings.redis_tls_cert_reqs}
    if settings.redis_tls_ca_file:
        options["ssl_ca_certs"] = settings.redis_tls_ca_file
    if settings.redis_tls_certfile:
        options["ssl_certfile"] = settings.redis_tls_certfile
    if settings.redis_tls_keyfile:
        options["ssl_keyfile"] = settings.redis_tls_keyfile
    return options


def broker_use_ssl(settings: Settings) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for this broker URL (None for plain ``redis://``)."""
    url = settings.effective_broker_url
    if is_sentinel_url(url):
        # kombu's Sentinel transport: TLS to the data nodes (the Sentinels' own is in
        # broker_transport_options' sentinel_kwargs).
        options = sentinel_tls_kwargs(settings)
        options.pop("ssl", None)
    else:
        options = redis_tls_kwargs(url, settings)
    if not options:
        return None
    options["ssl_cert_reqs"] = CERT_REQS[options["ssl_cert_reqs"]]
    return options
