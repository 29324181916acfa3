"""Wildcard listen addresses become one dialable address per interface."""

from __future__ import annotations

import pytest

from lattica._interfaces import expand, interface_ips, is_lan, is_loopback, is_private, on_local_network
from lattica._multiaddr import Multiaddr


def test_a_wildcard_becomes_each_interface_address_with_the_same_port():
    ips = interface_ips(4)
    assert "127.0.0.1" in ips  # every machine has loopback
    out = expand(Multiaddr("/ip4/0.0.0.0/udp/4001/quic-v1"))
    assert [str(a) for a in out] == [f"/ip4/{ip}/udp/4001/quic-v1" for ip in ips]


def test_specific_addresses_stay_as_they_are():
    for a in ("/ip4/10.1.2.3/tcp/4001", "/ip6/::1/tcp/1", "/dns/example.org/tcp/4001"):
        assert expand(Multiaddr(a)) == [Multiaddr(a)]


def test_ipv6_wildcards_leave_out_link_local_addresses():
    assert all(not str(a).startswith("/ip6/fe80") for a in expand(Multiaddr("/ip6/::/tcp/4001")))


def test_loopback():
    assert is_loopback(Multiaddr("/ip4/127.0.0.5/tcp/1")) and is_loopback(Multiaddr("/ip6/::1/tcp/1"))
    assert not is_loopback(Multiaddr("/ip4/192.0.2.1/tcp/1"))


def test_only_ip_addresses_beyond_loopback_are_on_the_lan():
    assert is_lan(Multiaddr("/ip4/192.0.2.1/tcp/1"))
    assert not is_lan(Multiaddr("/ip4/127.0.0.1/tcp/1"))
    assert not is_lan(Multiaddr("/memory/7"))


def test_private_ranges_and_not_the_documentation_ones():
    for a in (
        "/ip4/10.1.0.2/tcp/1",
        "/ip4/172.20.0.1/tcp/1",
        "/ip4/192.168.1.9/udp/1/quic-v1",
        "/ip4/100.64.3.4/tcp/1",
        "/ip4/169.254.1.1/tcp/1",
        "/ip4/127.0.0.1/tcp/1",
        "/ip6/fd00::1/tcp/1",
        "/ip6/::1/tcp/1",
    ):
        assert is_private(Multiaddr(a)), a
    # the NAT lab's internet is TEST-NET-2/3: public for us (ipaddress calls them private)
    for a in (
        "/ip4/198.51.100.10/tcp/1",
        "/ip4/203.0.113.5/tcp/1",
        "/ip4/8.8.8.8/tcp/1",
        "/ip4/172.32.0.1/tcp/1",
        "/memory/7",
        "/dns/example.org/tcp/1",
    ):
        assert not is_private(Multiaddr(a)), a
    assert not is_private(
        Multiaddr("/ip4/10.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
    )


def test_private_addresses_count_as_reachable_only_inside_our_own_subnets():
    assert on_local_network(Multiaddr("/ip4/127.0.0.1/tcp/1"))  # loopback is one of our networks
    assert on_local_network(Multiaddr("/ip4/198.51.100.10/tcp/1"))  # public: addressing is no obstacle
    assert on_local_network(Multiaddr("/memory/7"))
    ours = [str(a).split("/")[2] for a in expand(Multiaddr("/ip4/0.0.0.0/tcp/1"))]
    far = next(
        (
            ip
            for ip in ("10.254.254.254", "192.168.254.254", "172.31.254.254")
            if not any(o.startswith(ip.split(".")[0] + ".") for o in ours)
        ),
        None,
    )
    if far is None:
        pytest.skip(
            f"this machine has interfaces in every private range ({ours}): no foreign private address to test with"
        )
    assert not on_local_network(Multiaddr(f"/ip4/{far}/tcp/1"))  # someone else's LAN behind their NAT


@pytest.mark.parametrize(
    "addr",
    [
        "/ip4/0.0.0.0/tcp/1",
        "/ip6/::/tcp/1",  # the dialer's own host
        "/ip6/::ffff:10.0.0.1/tcp/1",
        "/ip6/64:ff9b::a00:1/tcp/1",
        "/ip6/2002:a00:1::1/tcp/1",  # IPv4 inside IPv6
        "/ip4/198.18.0.1/tcp/1",
        "/ip4/224.0.0.1/udp/1/quic-v1",
        "/ip4/255.255.255.255/tcp/1",
        "/ip6/ff02::1/tcp/1",
        "/dns4/localhost/tcp/1",
        "/dns/printer.local/tcp/1",
        "/dns6/LOCALHOST./tcp/1",
    ],
)
def test_addresses_that_are_no_public_peer_address_count_as_private(addr):
    assert is_private(Multiaddr(addr))


@pytest.mark.parametrize(
    "addr", ["/ip4/8.8.8.8/tcp/1", "/ip6/2606:4700::1111/tcp/1", "/ip6/::ffff:8.8.8.8/tcp/1", "/dns4/example.com/tcp/1"]
)
def test_public_addresses_and_names_do_not(addr):
    assert not is_private(Multiaddr(addr))
