"""lattica._iptext and the address checks built on it (lattica._interfaces, lattica._multiaddr) agree
with the standard library's ``ipaddress`` on random and edge-case addresses."""

from __future__ import annotations

import ipaddress
import random

import pytest

from lattica import _iptext as iptext
from lattica._interfaces import host_key, is_private_ip
from lattica._multiaddr import Multiaddr
from lattica.errors import MultiaddrError

_NETS = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "0.0.0.0/8",
        "192.0.0.0/24",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
        "::/128",
        "ff00::/8",
    )
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _private_by_ipaddress(ip: str) -> bool:
    """The rule as it was written with ``ipaddress``."""
    a = ipaddress.ip_address(ip)
    if a.version == 6:
        inner = a.ipv4_mapped or a.sixtofour or (ipaddress.IPv4Address(int(a) & 0xFFFFFFFF) if a in _NAT64 else None)
        if inner is not None:
            a = inner
    return any(a in n for n in _NETS if n.version == a.version)


def _addresses(count: int = 3000) -> list[str]:
    rng = random.Random(7)
    out = [
        "0.0.0.0",
        "255.255.255.255",
        "127.0.0.1",
        "10.1.2.3",
        "172.31.255.255",
        "172.32.0.0",
        "100.63.255.255",
        "100.64.0.1",
        "192.0.0.8",
        "192.0.2.1",
        "198.51.100.7",
        "203.0.113.9",
        "8.8.8.8",
        "::",
        "::1",
        "::2",
        "fe80::1",
        "febf::1",
        "fec0::1",
        "fc00::1",
        "fdff::1",
        "ff02::1",
        "2001:db8::1",
        "2606:4700::1111",
        "::ffff:10.0.0.1",
        "::ffff:8.8.8.8",
        "64:ff9b::a00:1",
        "64:ff9b::808:808",
        "2002:a00:1::1",
        "2002:808:808::1",
    ]
    for _ in range(count):
        if rng.random() < 0.5:
            out.append(str(ipaddress.IPv4Address(rng.getrandbits(32))))
        else:
            prefix = rng.choice(
                [0, 0xFFFF << 32, 0x2002 << 112, int(ipaddress.IPv6Address("64:ff9b::")), 0xFE80 << 112, 0xFC00 << 112]
            )
            out.append(str(ipaddress.IPv6Address(prefix | rng.getrandbits(48 if prefix else 128))))
    return out


def test_text_and_bytes_match_the_standard_library():
    for ip in _addresses():
        a = ipaddress.ip_address(ip)
        assert iptext.pack(ip) == a.packed and iptext.version(ip) == a.version
        assert ipaddress.ip_address(iptext.unpack(a.packed)) == a  # (IPv4 inside IPv6 is written dotted)
    assert iptext.pack("fe80::1%eth0") == ipaddress.IPv6Address("fe80::1").packed  # a zone is dropped


@pytest.mark.parametrize(
    "text", ["", "1.2.3", "01.2.3.4", "256.0.0.1", "1.2.3.4 ", "1::2::3", ":::", "example.com", "1.2.3.4/8", "é"]
)
def test_what_is_no_address_is_a_value_error(text):
    with pytest.raises(ValueError):
        iptext.pack(text)


def test_private_addresses_are_judged_as_before():
    for ip in _addresses():
        assert is_private_ip(ip) == _private_by_ipaddress(ip), ip


def test_an_ipv6_host_is_its_slash_64():
    for ip in [a for a in _addresses() if ":" in a]:
        assert ipaddress.ip_network(host_key(ip)) == ipaddress.IPv6Network((ip, 64), strict=False)
    assert host_key("10.0.0.1") == "10.0.0.1" and host_key("not an ip") == "not an ip"


def test_networks():
    net = iptext.network("10.1.2.3", 8)
    assert net == (4, int(ipaddress.IPv4Address("10.0.0.0")), 8)
    assert iptext.in_network(*iptext.to_int("10.200.0.1"), net) and not iptext.in_network(
        *iptext.to_int("11.0.0.1"), net
    )
    assert not iptext.in_network(*iptext.to_int("::a00:1"), net)  # (another version)
    with pytest.raises(ValueError):
        iptext.network("10.0.0.0", 33)


def test_multiaddrs_keep_the_ip_version_of_their_protocol():
    for text, binary in [("/ip4/10.0.0.1/tcp/1", True), ("/ip6/2001:db8::1/udp/5/quic-v1", True)]:
        a = Multiaddr(text)
        assert Multiaddr.from_bytes(a.to_bytes()) == a and str(Multiaddr.from_bytes(a.to_bytes())) == text
    for bad in ["/ip4/::1/tcp/1", "/ip6/10.0.0.1/tcp/1", "/ip4/1.2.3/tcp/1"]:
        with pytest.raises(MultiaddrError):
            Multiaddr(bad)
    assert str(Multiaddr.from_host_port("::ffff:1.2.3.4", 7)) == "/ip6/::ffff:1.2.3.4/tcp/7"
    assert str(Multiaddr.from_host_port("example.com", 7)) == "/dns/example.com/tcp/7"
