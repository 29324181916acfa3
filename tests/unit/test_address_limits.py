"""Limits per address count hosts (an IPv4 address, an IPv6 /64); what peers say they saw of us
counts only in the family of the connection they saw it on; which peers become our relays and
which of their addresses we advertise (lattica.nat._manager, the relay service)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from lattica._identity import KeyPair
from lattica._interfaces import addr_host_key
from lattica._multiaddr import Multiaddr
from lattica.nat._manager import NatManager
from lattica.transports.circuit import HOP


class _Conn:
    def __init__(self, addr: str, transport: str = "tcp") -> None:
        self.remote_addr, self.transport, self.is_closed = Multiaddr(addr), transport, False


_conn = _Conn


def test_relay_reservations_count_an_ipv6_64_as_one_address():
    a, b = Multiaddr("/ip6/2001:db8:1:2::1/tcp/4001"), Multiaddr("/ip6/2001:db8:1:2:ffff::9/tcp/5")
    assert addr_host_key(a) == addr_host_key(b)
    assert addr_host_key(Multiaddr("/ip6/2001:db8:1:3::1/tcp/1")) != addr_host_key(a)
    assert addr_host_key(Multiaddr("/ip4/192.0.2.1/tcp/1")) == "192.0.2.1"
    relayed = Multiaddr("/p2p-circuit")  # (no IP: its own key)
    assert addr_host_key(relayed) == "/p2p-circuit"


def test_observed_addresses_count_observers_by_host_and_only_in_the_connection_s_family():
    seen = {
        _conn("/ip6/2001:db8::1/tcp/1"): Multiaddr(
            "/ip4/10.9.99.99/udp/53/quic-v1"
        ),  # an IPv4 address "seen" over IPv6
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


def _nat(conns: dict, infos: dict, configured=()) -> SimpleNamespace:
    """What ``NatManager``'s relay methods see of a node (its connections, identify, config)."""
    loop = asyncio.new_event_loop()
    host = SimpleNamespace(
        conns=conns,
        info=infos,
        peer_id=None,
        loop=loop,
        protect=lambda *a: None,
        spawn=lambda c: c.close(),
    )
    return SimpleNamespace(host=host, relays={}, given_relays=list(configured), _addrs_changed=lambda: None)


def test_only_direct_members_or_configured_relays_become_our_relays():
    ids = [KeyPair.generate().peer_id for _ in range(3)]
    direct, relayed, stranger = (
        _Conn("/ip4/192.0.2.1/tcp/1"),
        _Conn("/ip4/192.0.2.2/tcp/1", "relay"),
        _Conn("/ip4/192.0.2.3/tcp/1"),
    )
    infos = {
        direct: SimpleNamespace(protocols=(HOP,), circle="member"),
        relayed: SimpleNamespace(protocols=(HOP,), circle="member"),
        stranger: SimpleNamespace(protocols=(HOP,), circle="stranger"),
    }
    nat = _nat(dict(zip(ids, [direct, relayed, stranger])), infos)
    assert NatManager._relay_candidates(nat) == [ids[0]]


def test_a_relay_s_reservation_names_only_addresses_at_the_ip_we_reach_it_at_and_lasts_a_minute_at_least():
    relay = KeyPair.generate().peer_id
    conn = _Conn("/ip4/192.0.2.1/tcp/4001")
    nat = _nat({relay: conn}, {})
    answer = {
        "expires": time.time() + 1,
        "addrs": [f"/ip4/10.9.88.{i}/tcp/443" for i in range(1, 8)] + ["/ip4/192.0.2.1/udp/4001/quic-v1"],
    }
    NatManager._reserved(nat, relay, answer)
    r = nat.relays[relay]
    assert [str(a) for a in r.addrs] == [f"/ip4/192.0.2.1/udp/4001/quic-v1/p2p/{relay}/p2p-circuit"]
    assert r.renew.when() - nat.host.loop.time() >= 29, "renewed at half of at least a minute"
    r.renew.cancel()
    nat.host.loop.close()
