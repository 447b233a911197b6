"""Built-in probe kinds ``http`` and ``tcp``, registered in the kinds registry on import.

A probe is ``probe(target, config, context) -> ProbeResult`` and never raises; its validator
``validate(target, config) -> config`` runs at check creation. A literal private address is
refused at creation unless ``CHECKBEAT_ALLOW_PRIVATE_TARGETS`` is set; names are judged at run
time, after resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_app.checks.kinds import check_kind
from celery_app.settings import get_settings
from workers.probes.http import http_probe, validate_http_config
from workers.probes.result import ProbeContext, ProbeResult
from workers.probes.tcp import tcp_probe, validate_tcp_config
from workers.target_guard import AddressPolicy


def creation_policy() -> AddressPolicy:
    """The guard's policy at check creation: this process's settings."""
    return AddressPolicy.from_settings(get_settings())


def _validate_http(target: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return validate_http_config(target, config, creation_policy())


def _validate_tcp(target: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return validate_tcp_config(target, config, creation_policy())


check_kind("http", validate=_validate_http)(http_probe)
check_kind("tcp", validate=_validate_tcp)(tcp_probe)

__all__ = [
    "ProbeContext",
    "ProbeResult",
    "http_probe",
    "tcp_probe",
    "validate_http_config",
    "validate_tcp_config",
]
