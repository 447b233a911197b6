"""Probe kinds: I/O functions ``probe(config, context) -> ProbeResult`` and their validators."""

from workers.probes.config import ProbeConfigError
from workers.probes.http import http_probe, validate_http_config
from workers.probes.result import ProbeContext, ProbeResult
from workers.probes.tcp import tcp_probe, validate_tcp_config

__all__ = [
    "ProbeConfigError",
    "ProbeContext",
    "ProbeResult",
    "http_probe",
    "tcp_probe",
    "validate_http_config",
    "validate_tcp_config",
]
