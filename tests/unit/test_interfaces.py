"""Wildcard listen addresses become one dialable address per interface."""

from __future__ import annotations

from lattica.interfaces import expand, interface_ips, is_lan, is_loopback
from lattica.multiaddr import Multiaddr


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
