"""Limits per address count hosts (an IPv4 address, an IPv6 /64), and what peers say they saw of
us counts only in the family of the connection they saw it on (lattica.nat, the relay service)."""

from __future__ import annotations

from types import SimpleNamespace

from lattica.actors.relay import _ip_of
from lattica.multiaddr import Multiaddr
from lattica.nat import NatManager


class _Conn:
    def __init__(self, addr: str, transport: str = "tcp") -> None:
        self.remote_addr, self.transport, self.is_closed = Multiaddr(addr), transport, False


_conn = _Conn


def test_relay_reservations_count_an_ipv6_64_as_one_address():
    a, b = _conn("/ip6/2001:db8:1:2::1/tcp/4001"), _conn("/ip6/2001:db8:1:2:ffff::9/tcp/5")
    assert _ip_of(a) == _ip_of(b)
    assert _ip_of(_conn("/ip6/2001:db8:1:3::1/tcp/1")) != _ip_of(a)
    assert _ip_of(_conn("/ip4/192.0.2.1/tcp/1")) == "192.0.2.1"


def test_observed_addresses_count_observers_by_host_and_only_in_the_connection_s_family():
    seen = {
        _conn("/ip6/2001:db8::1/tcp/1"): Multiaddr("/ip4/10.9.99.99/udp/53/quic-v1"),  # an IPv4 address "seen" over IPv6
        _conn("/ip6/2001:db8::2/tcp/1"): Multiaddr("/ip6/2001:db8:ffff::5/tcp/4001"),
        _conn("/ip6/2001:db8::3/tcp/1"): Multiaddr("/ip6/2001:db8:ffff::5/tcp/4001"),  # the same /64 as the one above
        _conn("/ip4/192.0.2.1/tcp/1"): Multiaddr("/ip4/203.0.113.5/tcp/4001"),
    }
    host = SimpleNamespace(info={c: SimpleNamespace(observed_addr=o) for c, o in seen.items()})
    got = NatManager.observations(SimpleNamespace(host=host))
    assert sorted((who, what) for who, what, _ in got) == [
        ("192.0.2.1", "/ip4/203.0.113.5/tcp/4001"),
        ("2001:db8::/64", "/ip6/2001:db8:ffff::5/tcp/4001"),
        ("2001:db8::/64", "/ip6/2001:db8:ffff::5/tcp/4001"),
    ]
    votes = {what: {who for who, w, _ in got if w == what} for _, what, _ in got}
    assert len(votes["/ip6/2001:db8:ffff::5/tcp/4001"]) == 1, "two addresses of one /64 are one observer"
