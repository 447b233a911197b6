"""The ``tcp`` probe: how long a TCP connect to ``host:port`` takes (nothing is sent or read).

One :class:`~workers.deadline.Deadline` covers the run: resolution (in a helper thread) and
every resolved address tried share ``timeout_s``, so the probe returns by then whatever the
resolver or the addresses do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from celery_app.errors import CheckFieldError
from workers.deadline import honours_deadline
from workers.probes.config import parse_config
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
    """A ``tcp`` check has no options besides its target."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_host_port(target: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port), or CheckFieldError on ``target``."""
    allowed = "host:port or [IPv6]:port, e.g. db.example.com:5432"
    if not isinstance(target, str) or ":" not in target:
        raise CheckFieldError("target", f"must be {allowed}, got {target!r}")
    host, _, port_text = target.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if literal_address(host) is None:
            raise CheckFieldError("target", f"{host!r} in brackets is not an IPv6 address")
    elif ":" in host:
        raise CheckFieldError("target", f"an IPv6 address needs brackets: {allowed}")
    if not host or any(c.isspace() or c in "/@?#[]" for c in host) or len(host) > 253:
        raise CheckFieldError("target", f"must be {allowed}, got {target!r}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise CheckFieldError("target", f"port must be 1..65535, got {port_text!r}")
    return host, int(port_text)


def validate_tcp_config(
    target: str, config: Mapping[str, Any], policy: AddressPolicy | None = None
) -> dict[str, Any]:
    """Validate a ``tcp`` check at creation; a literal private address is refused."""
    host, _port = parse_host_port(target)
    parse_config("tcp", TcpConfig, config)
    literal = literal_address(host)
    if policy is not None and literal is not None:
        try:
            vet_address(literal, host, policy)
        except TargetRefused as exc:
            raise CheckFieldError("target", str(exc)) from None
    return {}


@honours_deadline
def tcp_probe(target: str, config: Mapping[str, Any], context: ProbeContext) -> ProbeResult:
    """Connect once within the run's deadline; never raises (every failure is a result)."""
    deadline = context.run_deadline()
    try:
        host, port = parse_host_port(target)
    except ValueError as exc:
        return ProbeResult.down("error", f"invalid target: {exc}", 0.0)
    try:
        sock, address = connect_vetted(
            host, port, context.timeout_s, context.policy, deadline=deadline
        )
    except ResolutionFailed as exc:
        return ProbeResult.down("dns", str(exc), deadline.elapsed_ms())
    except TargetRefused as exc:
        return ProbeResult.down("refused", str(exc), deadline.elapsed_ms())
    except TimeoutError as exc:  # a connect timeout, or the deadline (DeadlineExceeded)
        return ProbeResult.down("timeout", f"connect timed out: {exc}", deadline.elapsed_ms())
    except OSError as exc:
        return ProbeResult.down("connect", f"{type(exc).__name__}: {exc}", deadline.elapsed_ms())
    latency = deadline.elapsed_ms()
    sock.close()
    return ProbeResult.up(latency, address=str(address))
