"""The private-target guard on IPv6 forms that carry an IPv4 address, and on site-local fec0::/10.

A relay (6to4, Teredo) or translator (NAT64) connects to the IPv4 address such an IPv6 address
carries, so ``2002:7f00:1::1`` reaches 127.0.0.1 just like the literal; the guard judges what is
embedded. Pure unit tests of :mod:`workers.target_guard` (no network).
"""

from __future__ import annotations

import ipaddress

import pytest

from celery_app.settings import load_settings
from workers.target_guard import (
    AddressPolicy,
    TargetRefused,
    embedded_ipv4,
    refusal_reason,
    vet_address,
)

CLOSED = AddressPolicy()


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        # site-local (deprecated by RFC 3879, but routable inside a site)
        ("fec0::1", "a site-local address"),
        ("feff:ffff::1", "a site-local address"),
        # 6to4: the IPv4 is bits 16..48
        ("2002:7f00:1::1", "a 6to4 address embedding 127.0.0.1 (a loopback address)"),
        ("2002:a00:1::1", "a 6to4 address embedding 10.0.0.1 (a private address)"),
        ("2002:c0a8:101::1", "a 6to4 address embedding 192.168.1.1 (a private address)"),
        ("2002:a9fe:101::1", "a 6to4 address embedding 169.254.1.1 (a link-local address)"),
        (
            "2002:a9fe:a9fe::",
            "a 6to4 address embedding 169.254.169.254 (a cloud metadata address)",
        ),
        ("2002::1", "a 6to4 address embedding 0.0.0.0 (the unspecified address)"),
        # Teredo: server = bits 32..64; client = last 32 bits XOR 0xffffffff
        (
            "2001:0:a00:1::f7f7:f7f7",  # server 10.0.0.1, client 8.8.8.8
            "a Teredo address embedding server 10.0.0.1 (a private address)",
        ),
        (
            "2001:0:808:808::80ff:fffe",  # server 8.8.8.8, client 127.0.0.1
            "a Teredo address embedding client 127.0.0.1 (a loopback address)",
        ),
        (
            "2001:0:808:808::5601:5efe",  # client 169.254.161.1
            "a Teredo address embedding client 169.254.161.1 (a link-local address)",
        ),
        # NAT64: the last 32 bits, well-known /96 and local-use /48 prefixes
        ("64:ff9b::7f00:1", "a NAT64 address embedding 127.0.0.1 (a loopback address)"),
        ("64:ff9b::a9fe:a9fe", "a NAT64 address embedding 169.254.169.254 (a cloud metadata"),
        ("64:ff9b::", "a NAT64 address embedding 0.0.0.0 (the unspecified address)"),
        ("64:ff9b:1::a00:1", "a NAT64 address embedding 10.0.0.1 (a private address)"),
        ("64:ff9b:1:ab::c0a8:1", "a NAT64 address embedding 192.168.0.1 (a private address)"),
        # IPv4-compatible (deprecated) and IPv4-mapped
        ("::127.0.0.1", "an IPv4-compatible address embedding 127.0.0.1 (a loopback address)"),
        ("::10.1.2.3", "an IPv4-compatible address embedding 10.1.2.3 (a private address)"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("::ffff:10.0.0.1", "a private address"),
        ("::ffff:169.254.169.254", "a cloud metadata address"),
        ("::ffff:0.0.0.0", "the unspecified address"),
        # the plain IPv6 specials are still named as themselves
        ("::1", "a loopback address"),
        ("::", "the unspecified address"),
    ],
)
def test_embedded_private_ipv4_is_refused_naming_the_form(address, reason):
    assert refusal_reason(ip(address)).startswith(reason)
    with pytest.raises(TargetRefused, match="CHECKBEAT_ALLOW_PRIVATE_TARGETS"):
        vet_address(ip(address), "target.example", CLOSED)


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:8.8.8.8",  # IPv4-mapped 8.8.8.8
        "2606:4700:4700::1111",  # a plain public address is untouched
    ],
)
def test_a_public_address_is_let_through(address):
    assert refusal_reason(ip(address)) is None
    assert vet_address(ip(address), "target.example", CLOSED) == ip(address)


@pytest.mark.skipif(
    not ipaddress.ip_address("2002:808:808::1").is_global,
    reason="this Python's ipaddress calls all of 2002::/16 non-global (newer stdlib releases)",
)
def test_a_6to4_address_of_a_public_ipv4_is_let_through():
    assert refusal_reason(ip("2002:808:808::1")) is None


@pytest.mark.parametrize(
    "address",
    [
        "2002:808:808::1",  # 6to4 of 8.8.8.8 (allowed where the stdlib calls it global)
        "2001:0:808:808::f7f7:f7f7",  # Teredo, server and client 8.8.8.8
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "64:ff9b:1::808:808",
        "::8.8.8.8",  # IPv4-compatible
    ],
)
def test_public_embeddings_are_judged_as_the_ipv6_address_they_are(address):
    """Nothing embedded is refused, so the IPv6 address is judged on its own: the stdlib calls
    Teredo (2001::/23) private and NAT64 / IPv4-compatible (::/8) reserved, as before."""
    reason = refusal_reason(ip(address))
    assert reason in (None, "a private address", "a non-public address")
    assert address.startswith("2002:") or reason is not None


def test_embedded_ipv4_reads_every_form_from_the_right_bits():
    assert embedded_ipv4(ip("2002:c000:204::1")) == [("a 6to4 address embedding", ip("192.0.2.4"))]
    # RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (inverted 3fff:fdd2)
    assert embedded_ipv4(ip("2001:0:4136:e378:8000:63bf:3fff:fdd2")) == [
        ("a Teredo address embedding server", ip("65.54.227.120")),
        ("a Teredo address embedding client", ip("192.0.2.45")),
    ]
    assert embedded_ipv4(ip("64:ff9b::c000:221")) == [
        ("a NAT64 address embedding", ip("192.0.2.33"))
    ]
    assert embedded_ipv4(ip("::c000:221")) == [
        ("an IPv4-compatible address embedding", ip("192.0.2.33"))
    ]
    # mapped is judged as the IPv4 address itself; :: and ::1 embed nothing
    for plain in ("::ffff:192.0.2.33", "::", "::1", "2606:4700:4700::1111", "fec0::1"):
        assert embedded_ipv4(ip(plain)) == []


@pytest.mark.parametrize("address", ["2002:7f00:1::1", "fec0::1", "64:ff9b::a00:7"])
def test_the_allow_list_and_allow_private_still_open_what_they_did(address):
    refused = ip(address)
    assert vet_address(refused, address, AddressPolicy(allow_private=True)) == refused
    exempt = AddressPolicy(allowed=frozenset({refused}))
    assert vet_address(refused, address, exempt) == refused
    # the allow-list is exact: exempting one address opens no other
    with pytest.raises(TargetRefused):
        vet_address(ip("2002:7f00:2::1"), "other", exempt)


def test_allowed_target_addresses_from_settings_still_exempt_an_embedded_address():
    settings = load_settings(
        allow_private_targets=False, allowed_target_addresses="2002:a00:7::1, 10.0.0.7"
    )
    policy = AddressPolicy.from_settings(settings)
    assert policy.allowed == {ip("2002:a00:7::1"), ip("10.0.0.7")}
    assert vet_address(ip("2002:a00:7::1"), "h", policy) == ip("2002:a00:7::1")
    assert vet_address(ip("10.0.0.7"), "h", policy) == ip("10.0.0.7")
    with pytest.raises(TargetRefused, match=r"h \(2002:a00:8::1\) is a 6to4 address embedding"):
        vet_address(ip("2002:a00:8::1"), "h", policy)
    opened = AddressPolicy.from_settings(load_settings(allow_private_targets=True))
    assert vet_address(ip("fec0::1"), "h", opened) == ip("fec0::1")
