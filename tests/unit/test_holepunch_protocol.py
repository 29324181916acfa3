"""The hole-punch exchange and plan (sans-IO): roles, timing, many-port probing, bad input."""

from __future__ import annotations

import random

import pytest

from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat._holepunch import (
    DEPENDENT,
    INDEPENDENT,
    PORT_RANGE,
    UNKNOWN,
    Initiator,
    Punch,
    Responder,
    is_probe,
    probe_packet,
    probe_ports,
    tcp_only,
)

B_ADDRS = [Multiaddr("/ip4/198.51.100.7/tcp/4001"), Multiaddr("/ip4/198.51.100.7/udp/4001/quic-v1")]
A_ADDRS = [Multiaddr("/ip4/203.0.113.9/tcp/4001"), Multiaddr("/ip4/203.0.113.9/udp/5555/quic-v1")]


def exchange(b_nat: str = INDEPENDENT, a_nat: str = INDEPENDENT) -> tuple[Punch, Punch]:
    """Run the whole exchange between B (initiator) and A; return (B's punch, A's punch)."""
    b, a = Initiator(B_ADDRS, b_nat), Responder(A_ADDRS, a_nat)
    connect = b.start(now=10.0)
    answer = a.receive(connect)
    assert isinstance(answer, dict) and answer["type"] == "connect" and "token" not in answer
    sync, b_punch = b.receive(answer, now=10.040)
    a_punch = a.receive(sync)
    assert isinstance(a_punch, Punch)
    return b_punch, a_punch


def test_rtt_sets_the_initiators_delay_and_the_responder_acts_at_once():
    b, a = exchange()
    assert b.rtt == pytest.approx(0.040) and b.delay == pytest.approx(0.020)
    assert a.delay == 0.0 and a.rtt is None
    assert a.token == b.token and len(b.token) == 16


@pytest.mark.parametrize("held, rtt", [(0.5, 0.040), ("soon", 0.540), (-1.0, 0.540), (9.0, 0.540)])
def test_the_time_the_responder_held_our_connect_is_not_round_trip_time(held, rtt):
    """A fresh responder observes its mapping before it answers: that wait is not network
    time, or B would start its dials up to 0.5 s after A. A held time that is no number or
    longer than B waited is ignored."""
    b, a = Initiator(B_ADDRS, INDEPENDENT), Responder(A_ADDRS, INDEPENDENT)
    connect = b.start(now=10.0)
    answer = a.receive(connect, held=0.5)
    assert answer["held"] == 0.5
    answer["held"] = held
    _, punch = b.receive(answer, now=10.540)
    assert punch.rtt == pytest.approx(rtt) and punch.delay == pytest.approx(rtt / 2)


def test_roles_are_complementary():
    b, a = exchange()
    # TCP simultaneous open: exactly one Noise initiator (A, whose SYN leaves first)
    assert a.plan.tcp_initiator and not b.plan.tcp_initiator
    assert b.plan.tcp_targets == [A_ADDRS[0]] and a.plan.tcp_targets == [B_ADDRS[0]]
    # QUIC: A dials, B only sends punch datagrams; both know the other's UDP endpoint
    assert a.plan.quic_dial and not b.plan.quic_dial
    assert b.plan.quic_targets == [A_ADDRS[1]] and a.plan.quic_targets == [B_ADDRS[1]]
    assert not (a.plan.spray or b.plan.spray or a.plan.probe_ips or b.plan.probe_ips)


@pytest.mark.parametrize("hard_is_b", [True, False])
def test_one_symmetric_side_means_many_port_probing(hard_is_b):
    b, a = exchange(b_nat=DEPENDENT, a_nat=INDEPENDENT) if hard_is_b else exchange(b_nat=UNKNOWN, a_nat=DEPENDENT)
    hard, easy = (b, a) if hard_is_b else (a, b)
    hard_ip = (B_ADDRS if hard_is_b else A_ADDRS)[1].host_port()[0]
    assert hard.plan.spray and hard.plan.quic_dial and not hard.plan.probe_ips
    assert easy.plan.probe_ips == [hard_ip] and not easy.plan.spray and not easy.plan.quic_dial
    # a symmetric NAT gives the listening port no stable mapping: no TCP simultaneous open
    assert not hard.plan.tcp_targets and not easy.plan.tcp_targets


def test_both_symmetric_tries_only_the_plain_punch():
    b, a = exchange(DEPENDENT, DEPENDENT)
    assert not (a.plan.spray or b.plan.spray or a.plan.probe_ips or b.plan.probe_ips)
    assert a.plan.quic_dial and not a.plan.tcp_targets


def test_circuit_and_duplicate_addresses_are_dropped_and_the_list_is_capped():
    b = Initiator(B_ADDRS, INDEPENDENT)
    b.start(0.0)
    many = [f"/ip4/203.0.113.9/udp/{6000 + i}/quic-v1" for i in range(40)]
    relayed = "/ip4/198.51.100.10/tcp/4001/p2p/12D3KooWHZq69pjM1LEvBtDR6cWvErhjj4bWHE1fCW33vTpKQouM/p2p-circuit"
    _, punch = b.receive({"type": "connect", "addrs": [relayed, many[0], many[0]] + many, "nat": INDEPENDENT}, 0.01)
    targets = punch.plan.quic_targets
    assert len(targets) == len(set(targets)) <= 16 and not any(t.is_circuit for t in targets)


@pytest.mark.parametrize(
    "msg",
    [
        None,
        [],
        {"type": "sync"},
        {"type": "connect", "addrs": "nope", "nat": INDEPENDENT, "token": b"x" * 16},
        {"type": "connect", "addrs": [b"\x00"], "nat": INDEPENDENT, "token": b"x" * 16},
        {"type": "connect", "addrs": ["/not/a/multiaddr"], "nat": INDEPENDENT, "token": b"x" * 16},
        {"type": "connect", "addrs": [], "nat": "full-cone-ish", "token": b"x" * 16},
        {"type": "connect", "addrs": [], "nat": INDEPENDENT},  # no token
        {"type": "connect", "addrs": [], "nat": INDEPENDENT, "token": b"short"},
    ],
)
def test_a_bad_first_message_is_a_protocol_error(msg):
    with pytest.raises(ProtocolError):
        Responder(A_ADDRS, INDEPENDENT).receive(msg)


def test_messages_out_of_order_are_protocol_errors():
    a = Responder(A_ADDRS, INDEPENDENT)
    a.receive(Initiator(B_ADDRS, INDEPENDENT).start(0.0))
    with pytest.raises(ProtocolError):
        a.receive({"type": "connect", "addrs": [], "nat": INDEPENDENT})  # a second connect, not sync
    b = Initiator(B_ADDRS, INDEPENDENT)
    with pytest.raises(ProtocolError):
        b.receive({"type": "connect", "addrs": [], "nat": INDEPENDENT}, 0.0)  # before start
    b.start(0.0)
    b.receive({"type": "connect", "addrs": [], "nat": INDEPENDENT}, 0.0)
    with pytest.raises(ProtocolError):
        b.receive({"type": "connect", "addrs": [], "nat": INDEPENDENT}, 0.0)  # twice


def test_probe_datagrams_carry_the_token_and_are_never_quic():
    token = bytes(range(16))
    pkt = probe_packet(token)
    assert pkt[0] == 0  # QUIC packets always have a 1 in the top two bits
    assert is_probe(pkt, token)
    assert not is_probe(pkt, bytes(16)) and not is_probe(pkt[:-1], token) and not is_probe(pkt + b"x", token)


def test_probe_ports_are_distinct_and_in_the_nat_range():
    ports = probe_ports(5000, random.Random(1))
    assert len(ports) == len(set(ports)) == 5000
    assert all(PORT_RANGE[0] <= p <= PORT_RANGE[1] for p in ports)


@pytest.mark.parametrize(
    "b_nat,a_nat",
    [(INDEPENDENT, INDEPENDENT), (DEPENDENT, INDEPENDENT), (INDEPENDENT, DEPENDENT), (UNKNOWN, DEPENDENT)],
)
def test_a_tcp_only_punch_opens_on_one_side_and_dials_on_the_other(b_nat, a_nat):
    """Over a direct QUIC connection (B asks: it dialed A over QUIC): A sends SYNs from its
    listening port towards B's TCP candidates at B's address, B then dials A's plainly; both run
    Noise as initiators on what they open (no two responders on one connection), UDP is not
    used, and a symmetric side does not stop it (outbound dials need no prediction)."""
    b_punch, a_punch = exchange(b_nat, a_nat)
    assert b_punch.theirs == A_ADDRS and a_punch.theirs == B_ADDRS  # what each punch was told
    assert b_punch.nats == (b_nat, a_nat) and a_punch.nats == (a_nat, b_nat)
    extra_a = A_ADDRS + [Multiaddr("/ip4/192.0.2.50/tcp/4001"), Multiaddr("/ip4/203.0.113.9/tcp/4002")]
    b_plan = tcp_only(extra_a, "203.0.113.9", asker=True, nats=b_punch.nats)
    a_plan = tcp_only(a_punch.theirs, "198.51.100.7", asker=False, nats=a_punch.nats)
    assert [str(x) for x in b_plan.tcp_targets] == ["/ip4/203.0.113.9/tcp/4001", "/ip4/203.0.113.9/tcp/4002"]
    assert [str(x) for x in a_plan.tcp_targets] == ["/ip4/198.51.100.7/tcp/4001"]
    # A opens and B dials, unless only A's mapping depends on the destination: then B opens
    a_opens = not (a_nat == DEPENDENT and b_nat != DEPENDENT)
    assert (b_plan.tcp_dial, a_plan.tcp_dial) == ((True, False) if a_opens else (False, True))
    assert b_plan.tcp_initiator and a_plan.tcp_initiator
    for p in (a_plan, b_plan):
        assert not p.quic_targets and not p.quic_dial and not p.spray and not p.probe_ips


def test_a_tcp_only_punch_aims_at_nothing_but_the_connections_address():
    lies = [
        Multiaddr("/ip4/192.0.2.1/tcp/4001"),
        Multiaddr("/ip4/192.0.2.1/udp/4001/quic-v1"),
        Multiaddr("/ip4/10.0.0.1/tcp/22"),
    ]
    assert tcp_only(lies, "198.51.100.7", asker=False).tcp_targets == []
    assert tcp_only(lies, "198.51.100.7", asker=True).tcp_targets == []
