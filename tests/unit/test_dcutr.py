"""DCUtR's two roles (lattica/nat/_holepunch.py: DcutrInitiator, DcutrResponder) over encoded
messages, sans-IO: the roles and timing of our own hole punching, addresses only, no probing."""

from __future__ import annotations

import pytest

from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat import _dcutr_wire as wire
from lattica.nat._holepunch import DcutrInitiator, DcutrResponder, Punch

B_ADDRS = [Multiaddr("/ip4/203.0.113.7/tcp/4001"), Multiaddr("/ip4/203.0.113.7/udp/4001/quic-v1")]
A_ADDRS = [
    Multiaddr("/ip4/198.51.100.9/tcp/5001/p2p/12D3KooWD2BbyhWrJkw27G8jUZ6hYCedvkip7tjwZ159v3wknYhD"),
    Multiaddr("/ip4/198.51.100.9/udp/5001/quic-v1"),
    Multiaddr("/ip4/198.51.100.9/tcp/5002/p2p/12D3KooWD2BbyhWrJkw27G8jUZ6hYCedvkip7tjwZ159v3wknYhD/p2p-circuit"),
]


def _over_the_wire(msg: wire.HolePunch) -> wire.HolePunch:
    return wire.decode(wire.encode(msg))


def test_the_exchange_gives_both_sides_the_simultaneous_plan_at_the_right_moment() -> None:
    b, a = DcutrInitiator(B_ADDRS), DcutrResponder(A_ADDRS)
    connect = _over_the_wire(b.start(now=10.0))
    assert connect.type == wire.PunchType.CONNECT and list(connect.addrs) == B_ADDRS
    answer = a.receive(connect)
    assert isinstance(answer, wire.HolePunch) and answer.type == wire.PunchType.CONNECT
    sync, b_punch = b.receive(_over_the_wire(answer), now=10.08)
    assert sync.type == wire.PunchType.SYNC
    a_punch = a.receive(_over_the_wire(sync))
    assert isinstance(a_punch, Punch)
    # B waits half the round trip; A acts at once on SYNC
    assert b_punch.rtt == pytest.approx(0.08) and b_punch.delay == pytest.approx(0.04) and a_punch.delay == 0
    assert b_punch.libp2p and a_punch.libp2p
    # A runs the Noise initiator on the TCP simultaneous open and dials QUIC; B sends datagrams
    assert a_punch.plan.tcp_initiator and not b_punch.plan.tcp_initiator
    assert a_punch.plan.quic_dial and not b_punch.plan.quic_dial
    # only the peer's direct addresses, without /p2p (the circuit one is not punched)
    assert [str(t) for t in b_punch.plan.tcp_targets] == ["/ip4/198.51.100.9/tcp/5001"]
    assert [str(t) for t in b_punch.plan.quic_targets] == ["/ip4/198.51.100.9/udp/5001/quic-v1"]
    assert a_punch.plan.tcp_targets == [B_ADDRS[0]] and a_punch.plan.quic_targets == [B_ADDRS[1]]
    for p in (a_punch, b_punch):  # a libp2p peer neither sprays nor probes
        assert not p.plan.spray and not p.plan.probe_ips


def test_hundreds_of_addresses_are_cut_to_a_few_usable_ones() -> None:
    many = tuple(Multiaddr(f"/ip4/192.0.2.{i % 250 + 1}/tcp/{1000 + i}") for i in range(300))
    data = wire.encode(wire.HolePunch(wire.PunchType.CONNECT, many[:16])) + b"".join(
        b"\x12\x08" + m.to_bytes()[:8]
        for m in many[16:40]  # truncated, unreadable addresses
    )
    a = DcutrResponder(A_ADDRS)
    a.receive(wire.decode(data))
    punch = a.receive(wire.HolePunch(wire.PunchType.SYNC))
    assert isinstance(punch, Punch) and len(punch.theirs) <= wire.MAX_ADDRS
    b = DcutrInitiator(B_ADDRS)
    b.start(0.0)
    _, punch = b.receive(wire.HolePunch(wire.PunchType.CONNECT, many[:16]), 0.1)
    assert len(punch.theirs) == 16


def test_messages_out_of_order_are_protocol_errors() -> None:
    a = DcutrResponder(A_ADDRS)
    with pytest.raises(ProtocolError):
        a.receive(wire.HolePunch(wire.PunchType.SYNC))
    a.receive(wire.HolePunch(wire.PunchType.CONNECT, tuple(B_ADDRS)))
    with pytest.raises(ProtocolError):
        a.receive(wire.HolePunch(wire.PunchType.CONNECT))
    b = DcutrInitiator(B_ADDRS)
    with pytest.raises(ProtocolError):  # nothing sent yet
        b.receive(wire.HolePunch(wire.PunchType.CONNECT), 0.0)
    b.start(0.0)
    with pytest.raises(ProtocolError):
        b.receive(wire.HolePunch(wire.PunchType.SYNC), 0.1)
