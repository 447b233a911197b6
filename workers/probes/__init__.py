"""Built-in probe kinds ``http`` and ``tcp``, registered as shared check kinds on import.

A probe is ``probe(target, config, context) -> ProbeResult`` and never raises; its validator
``validate(target, config, settings) -> config`` runs at check creation, under the settings of
the store creating the check. A literal private address is refused at creation unless those
settings allow it (``CHECKBEAT_ALLOW_PRIVATE_TARGETS``, ``CHECKBEAT_ALLOWED_TARGET_ADDRESSES``);
names are judged at run time, after resolution, under the worker's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_app.checks.kinds import check_kind
from celery_app.settings import Settings
from workers.probes.http import http_probe, validate_http_config
from workers.probes.result import ProbeContext, ProbeResult
from workers.probes.tcp import tcp_probe, validate_tcp_config
from workers.target_guard import AddressPolicy


def creation_policy(settings: Settings) -> AddressPolicy:
    """The guard's policy at check creation: the settings of whoever creates the check."""
    return AddressPolicy.from_settings(settings)


def _validate_http(target: str, config: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    return validate_http_config(target, config, creation_policy(settings))


def _validate_tcp(target: str, config: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    return validate_tcp_config(target, config, creation_policy(settings))


check_kind("http", validate=_validate_http)(http_probe)
check_kind("tcp", validate=_validate_tcp)(tcp_probe)

__all__ = [
    "ProbeContext",
    "ProbeResult",
    "creation_policy",
    "http_probe",
    "tcp_probe",
    "validate_http_config",
    "validate_tcp_config",
]
