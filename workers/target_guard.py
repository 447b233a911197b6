"""Which addresses a probe may reach, decided after DNS resolution.

Why: tenants choose probe targets, so a check is a way to make our workers open connections on
the tenant's behalf. Without a guard a check could read cloud metadata (169.254.169.254), scan the
private network or hit services bound to loopback. The guard vets the *resolved* addresses (a
name that resolves to 127.0.0.1 is refused like the literal), and the probes connect to exactly
the address that was vetted, so a DNS answer that changes between the check and the connect (DNS
rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Cloud metadata endpoints that are not caught by a range property on every Python version.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("fd00:ec2::254"),  # AWS IPv6
    }
)


class TargetRefused(Exception):
    """The target resolves to an address probes may not reach."""


class ResolutionFailed(Exception):
    """The target's name did not resolve."""


@dataclass(frozen=True)
class AddressPolicy:
    """Whether non-public addresses are allowed (``CHECKBEAT_ALLOW_PRIVATE_TARGETS``).

    ``allowed`` exempts single addresses (an internal target an operator vouches for) without
    opening the whole private range.
    """

    allow_private: bool = False
    allowed: frozenset[IPAddress] = frozenset()

    @classmethod
    def from_settings(cls, settings: Any) -> AddressPolicy:
        """``CHECKBEAT_ALLOW_PRIVATE_TARGETS`` and ``CHECKBEAT_ALLOWED_TARGET_ADDRESSES``."""
        return cls(
            allow_private=settings.allow_private_targets,
            allowed=frozenset(ipaddress.ip_address(a) for a in settings.allowed_target_addresses),
        )


def refusal_reason(address: IPAddress) -> str | None:
    """Why ``address`` is off limits, or None when a probe may connect to it.

    Pure: uses only the stdlib ``ipaddress`` properties. An IPv4-mapped IPv6 address
    (``::ffff:127.0.0.1``) is judged as the IPv4 address it carries.
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return refusal_reason(address.ipv4_mapped)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a non-public address"
    return None


def vet_address(address: IPAddress, host: str, policy: AddressPolicy) -> IPAddress:
    """Return ``address`` if the policy lets probes reach it, else raise TargetRefused."""
    if policy.allow_private or address in policy.allowed:
        return address
    reason = refusal_reason(address)
    if reason is not None:
        shown = host if host == str(address) else f"{host} ({address})"
        raise TargetRefused(
            f"target {shown} is {reason}; probes only reach public addresses "
            "unless CHECKBEAT_ALLOW_PRIVATE_TARGETS is set"
        )
    return address


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells literally (``10.0.0.1``, ``[::1]``), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (TCP), in resolver order, without duplicates."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolutionFailed(f"cannot resolve {host!r}: {exc}") from exc
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ResolutionFailed(f"{host!r} resolved to no address")
    return addresses


def resolve_vetted(host: str, port: int, policy: AddressPolicy) -> list[IPAddress]:
    """Resolve ``host`` and vet every answer: one refused address refuses the target.

    Refusing on any bad answer (rather than picking a good one) keeps a name that mixes a
    public and a private address from reaching the private one on a later resolution.
    """
    addresses = resolve(host, port)
    for address in addresses:
        vet_address(address, host, policy)
    return addresses


def connect_vetted(
    host: str, port: int, timeout: float, policy: AddressPolicy
) -> tuple[socket.socket, IPAddress]:
    """Open a TCP connection to a vetted address of ``host`` (tried in resolver order).

    The socket is connected to the very address that was vetted: there is no second lookup
    for a rebinding DNS server to answer differently.
    """
    last_error: OSError | None = None
    for address in resolve_vetted(host, port, policy):
        try:
            sock = socket.create_connection((str(address), port), timeout=timeout)
        except OSError as exc:
            last_error = exc
            continue
        return sock, address
    assert last_error is not None
    raise last_error
