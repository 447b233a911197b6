"""Which addresses a probe may reach, decided after DNS resolution.

Why: tenants choose probe targets, so a check is a way to make our workers open connections on
the tenant's behalf. Without a guard a check could read cloud metadata (169.254.169.254), scan the
private network or hit services bound to loopback. The guard vets the *resolved* addresses (a
name that resolves to 127.0.0.1 is refused like the literal), and the probes connect to exactly
the address that was vetted, so a DNS answer that changes between the check and the connect (DNS
rebinding) cannot slip through.

An IPv6 address can carry an IPv4 one (6to4, Teredo, NAT64, IPv4-mapped and -compatible forms)
and a relay or translator then connects to that IPv4 address: such an address is refused when
what it carries would be (``2002:7f00:1::1`` is loopback by another name).
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_app.errors import CheckbeatError
from workers.deadline import Deadline, DeadlineExceeded

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


class TargetRefused(CheckbeatError, Exception):
    """The target resolves to an address probes may not reach."""


class ResolutionFailed(CheckbeatError, Exception):
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


#: NAT64 prefixes whose last 32 bits are the IPv4 address the translator connects to: the
#: well-known prefix (RFC 6052) and the local-use prefix (RFC 8215, assumed used as a /96).
NAT64_PREFIXES = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
)
#: ``::/96`` minus ``::`` and ``::1``: the deprecated IPv4-compatible form (RFC 4291 2.5.5.1).
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries and hands traffic to, each with a phrase
    naming its form (``"a 6to4 address embedding"``).

    6to4 (``2002::/16``, bits 16..48), Teredo (``2001::/32``: the server, bits 32..64, and the
    client, the last 32 bits inverted), NAT64 (the last 32 bits) and IPv4-compatible
    (``::a.b.c.d``). IPv4-mapped (``::ffff:a.b.c.d``) is not listed: it *is* the IPv4 address
    (a socket connects to the IPv4 host) and is judged as one by :func:`refusal_reason`.
    """
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if address.sixtofour is not None:
        found.append(("a 6to4 address embedding", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found.append(("a Teredo address embedding server", server))
        found.append(("a Teredo address embedding client", client))
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in prefix for prefix in NAT64_PREFIXES):
        found.append(("a NAT64 address embedding", low32))
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        found.append(("an IPv4-compatible address embedding", low32))
    return found


def refusal_reason(address: IPAddress) -> str | None:
    """Why ``address`` is off limits, or None when a probe may connect to it.

    Pure: uses only the stdlib ``ipaddress`` properties. An IPv4-mapped IPv6 address
    (``::ffff:127.0.0.1``) is judged as the IPv4 address it carries. An IPv6 address that
    embeds IPv4 addresses (6to4, Teredo, NAT64, IPv4-compatible: see :func:`embedded_ipv4`) is
    refused when any of them would be; if they are all public it is judged as itself (today's
    stdlib calls Teredo private and NAT64 reserved, so only a public 6to4 passes).
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return refusal_reason(address.ipv4_mapped)
        for phrase, ipv4 in embedded_ipv4(address):
            inner = refusal_reason(ipv4)
            if inner is not None:
                return f"{phrase} {ipv4} ({inner})"
        if address.is_site_local:
            return "a site-local address"
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
    """Return ``address`` if the policy lets workers reach it, else raise TargetRefused."""
    if policy.allow_private or address in policy.allowed:
        return address
    reason = refusal_reason(address)
    if reason is not None:
        shown = host if host == str(address) else f"{host} ({address})"
        raise TargetRefused(
            f"target {shown} is {reason}; workers only reach public addresses "
            "unless CHECKBEAT_ALLOW_PRIVATE_TARGETS is set"
        )
    return address


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells literally (``10.0.0.1``, ``[::1]``), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int, deadline: Deadline | None = None) -> list[IPAddress]:
    """Every address ``host`` resolves to (TCP), in resolver order, without duplicates.

    With a ``deadline`` the lookup runs in a helper thread and the caller stops waiting when the
    budget is spent (DeadlineExceeded): ``getaddrinfo`` cannot be interrupted, so a resolver
    that does not answer would otherwise hold the probe for its own timeouts (5 s x attempts
    x servers). The abandoned thread ends when the system resolver gives up.
    """
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        if deadline is None:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        else:
            infos = _getaddrinfo_by(host, port, deadline)
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


def _getaddrinfo_by(host: str, port: int, deadline: Deadline) -> list[Any]:
    """``socket.getaddrinfo`` in a daemon thread, waited for until ``deadline`` at most."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # handed to the waiting caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=lookup, name="checkbeat-resolve", daemon=True).start()
    if not done.wait(deadline.bound(what=f"resolving {host!r}")):
        raise DeadlineExceeded(f"resolving {host!r} did not finish within {deadline.timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["infos"]


def resolve_vetted(
    host: str, port: int, policy: AddressPolicy, deadline: Deadline | None = None
) -> list[IPAddress]:
    """Resolve ``host`` (within ``deadline`` if given) and vet every answer: one refused
    address refuses the target.

    Refusing on any bad answer (rather than picking a good one) keeps a name that mixes a
    public and a private address from reaching the private one on a later resolution.
    """
    addresses = resolve(host, port, deadline)
    for address in addresses:
        vet_address(address, host, policy)
    return addresses


def connect_vetted(
    host: str,
    port: int,
    timeout: float,
    policy: AddressPolicy,
    *,
    deadline: Deadline | None = None,
) -> tuple[socket.socket, IPAddress]:
    """Open a TCP connection to a vetted address of ``host`` (tried in resolver order).

    The socket is connected to the very address that was vetted: there is no second lookup
    for a rebinding DNS server to answer differently.

    One budget covers the whole call: ``deadline`` if given (``timeout`` then caps each
    connect), else ``timeout`` from now. Resolution and every address tried share it, so six
    black-holed addresses cost the budget once, not six times. Raises DeadlineExceeded (a
    TimeoutError) when it is spent, TimeoutError/OSError from the last address otherwise.
    """
    deadline = deadline if deadline is not None else Deadline(timeout)
    addresses = resolve_vetted(host, port, policy, deadline)
    last_error: OSError | None = None
    tried = 0
    for address in addresses:
        if deadline.expired:
            break
        budget = deadline.bound(timeout, what=f"connecting to {host}")
        tried += 1
        try:
            return socket.create_connection((str(address), port), timeout=budget), address
        except OSError as exc:
            last_error = exc
    if last_error is None or deadline.expired:
        raise DeadlineExceeded(
            f"no address of {host} answered within {deadline.timeout_s:g} s "
            f"(tried {tried} of {len(addresses)})"
        ) from last_error
    raise last_error


@dataclass
class Vetting:
    """A :func:`vetted_resolution` block's policy, and what it refused (a client library may
    catch the TargetRefused and report a failure of its own: the refusal says why)."""

    policy: AddressPolicy
    refused: list[str]


#: The vetting under which this context resolves (None: unguarded). A context variable, not a
#: thread-local: Apprise runs each send on its executor in a copy of the caller's context.
_vetting: contextvars.ContextVar[Vetting | None] = contextvars.ContextVar(
    "checkbeat_vetting", default=None
)
_system_getaddrinfo = socket.getaddrinfo
_install_lock = threading.Lock()


def _vetted_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """``socket.getaddrinfo``, whose every answer is vetted inside :func:`vetted_resolution`
    (elsewhere: unchanged)."""
    answers = _system_getaddrinfo(host, port, *args, **kwargs)
    vetting = _vetting.get()
    if vetting is not None:
        shown = host.decode() if isinstance(host, bytes) else str(host)
        for *_, sockaddr in answers:
            text = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone is no part of the address
            try:
                vet_address(ipaddress.ip_address(text), shown, vetting.policy)
            except TargetRefused as exc:
                vetting.refused.append(str(exc))
                raise
    return answers


@contextmanager
def vetted_resolution(policy: AddressPolicy) -> Iterator[Vetting]:
    """Within the block, every name or address this context resolves, by whatever client
    (Apprise's HTTP and SMTP clients, through ``socket.getaddrinfo``), is vetted as a probe's
    target is: a refused one raises TargetRefused before any connection, and is listed in the
    :class:`Vetting` the block gets.

    Why: a notification target is a tenant's URL too, and a client library connects where it
    resolves, so the guard sits where every client resolves. A literal address goes through
    ``getaddrinfo`` as well (urllib3 and smtplib both call it), and the connection is made to
    the answers vetted, with no second lookup for a rebinding DNS server to answer.
    """
    with _install_lock:
        if socket.getaddrinfo is not _vetted_getaddrinfo:
            socket.getaddrinfo = _vetted_getaddrinfo
    vetting = Vetting(policy, [])
    token = _vetting.set(vetting)
    try:
        yield vetting
    finally:
        _vetting.reset(token)
