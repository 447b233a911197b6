"""The ``tcp`` probe: how long a TCP connect to host:port takes (nothing is sent)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.probes.config import ProbeConfigError, parse_config
from workers.probes.result import ProbeContext, ProbeResult
from workers.target_guard import (
    AddressPolicy,
    ResolutionFailed,
    TargetRefused,
    connect_vetted,
    literal_address,
    vet_address,
)


class TcpConfig(BaseModel):
    """A ``tcp`` check: the host (name or address) and port to connect to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if literal_address(value) is None and any(c.isspace() or c in "/:@?#[]" for c in value):
            raise ValueError(f"must be a host name or an IP address, got {value!r}")
        return value


def validate_tcp_config(
    config: Mapping[str, Any], policy: AddressPolicy | None = None
) -> dict[str, Any]:
    """Validate a ``tcp`` check config at creation; a literal private address is refused."""
    parsed = parse_config("tcp", TcpConfig, config)
    literal = literal_address(parsed.host)
    if policy is not None and literal is not None:
        try:
            vet_address(literal, parsed.host, policy)
        except TargetRefused as exc:
            raise ProbeConfigError(f"invalid tcp check config: host: {exc}") from None
    return parsed.model_dump(mode="json")


def tcp_probe(config: Mapping[str, Any], context: ProbeContext) -> ProbeResult:
    """Connect once; never raises (every failure is a result with its error class)."""
    started = time.perf_counter()

    def elapsed_ms() -> float:
        return (time.perf_counter() - started) * 1000.0

    try:
        spec = TcpConfig.model_validate(dict(config))
    except ValueError as exc:
        return ProbeResult.down("error", f"invalid config: {exc}", 0.0)
    try:
        sock, address = connect_vetted(spec.host, spec.port, context.timeout_s, context.policy)
    except ResolutionFailed as exc:
        return ProbeResult.down("dns", str(exc), elapsed_ms())
    except TargetRefused as exc:
        return ProbeResult.down("refused", str(exc), elapsed_ms())
    except TimeoutError as exc:
        return ProbeResult.down("timeout", f"connect timed out: {exc}", elapsed_ms())
    except OSError as exc:
        return ProbeResult.down("connect", f"{type(exc).__name__}: {exc}", elapsed_ms())
    latency = elapsed_ms()
    sock.close()
    return ProbeResult.up(latency, address=str(address))
