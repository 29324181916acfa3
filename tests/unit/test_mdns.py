"""mDNS messages (sans-IO): queries, answers, compressed names, and hostile packets."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._host.mdns import SERVICE, MdnsProtocol, build_query, build_response, parse
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError

A, B = KeyPair.generate().peer_id, KeyPair.generate().peer_id


def _addrs(peer, *hosts):
    return [Multiaddr(f"/ip4/{h}/tcp/4001/p2p/{peer}") for h in hosts]


def test_a_query_is_answered_with_our_addresses_and_the_answer_names_us():
    a, b = MdnsProtocol(A), MdnsProtocol(B)
    answer, found = b.receive(a.query(), _addrs(B, "192.168.1.7", "10.0.0.7"))
    assert found == [] and answer is not None
    none, found = a.receive(answer, _addrs(A, "192.168.1.5"))
    assert none is None and len(found) == 1
    assert found[0].peer == B and [str(x) for x in found[0].addrs] == [
        "/ip4/192.168.1.7/tcp/4001",
        "/ip4/10.0.0.7/tcp/4001",
    ]


def test_no_answer_without_addresses_or_to_other_questions():
    b = MdnsProtocol(B)
    assert b.receive(build_query(), []) == (None, [])
    other = struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + b"\x05_http\x04_tcp\x05local\x00" + struct.pack(">HH", 12, 1)
    assert b.receive(other, _addrs(B, "192.168.1.7")) == (None, [])


def test_our_own_answer_and_unusable_records_are_ignored():
    a = MdnsProtocol(A)
    own = build_response("x" * 10, _addrs(A, "192.168.1.5"))
    assert a.receive(own, []) == (None, [])
    bad = build_response("y" * 10, [Multiaddr("/ip4/192.168.1.9/tcp/4001")])  # no /p2p/ part
    assert a.receive(bad, []) == (None, [])


def test_compressed_names_in_answers_are_understood():
    # an answer in the style of other responders: the TXT record's name points back into the PTR
    inst = b"\x0cabcdefabcdef"
    head = struct.pack(">HHHHHH", 0, 0x8400, 0, 1, 0, 1)
    service = b"\x04_p2p\x04_udp\x05local\x00"
    ptr_target = inst + b"\xc0\x0c"  # instance label, then a pointer to the service name at 12
    ptr = service + struct.pack(">HHIH", 12, 1, 120, len(ptr_target)) + ptr_target
    target_at = 12 + len(service) + 10  # where the PTR's target name starts
    txt = f"dnsaddr=/ip4/192.168.1.9/udp/4001/quic-v1/p2p/{B}".encode()
    rdata = bytes([len(txt)]) + txt
    record = struct.pack(">H", 0xC000 | target_at) + struct.pack(">HHIH", 16, 1, 120, len(rdata)) + rdata
    _, found = MdnsProtocol(A).receive(head + ptr + record, [])
    assert len(found) == 1 and found[0].peer == B and str(found[0].addrs[0]) == "/ip4/192.168.1.9/udp/4001/quic-v1"


@pytest.mark.parametrize(
    "packet, match",
    [
        (b"\x00" * 5, "shorter than its header"),
        (struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + b"\x05_p2p", "runs past"),
        (struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + b"\xc0\x0c", "loop"),  # a pointer to itself
        (struct.pack(">HHHHHH", 0, 0, 200, 0, 0, 0), "too many records"),
        (b"\x00" * 9001, "too large"),
        (
            struct.pack(">HHHHHH", 0, 0x8400, 0, 1, 0, 0) + b"\x00" + struct.pack(">HHIH", 16, 1, 120, 50) + b"x",
            "runs past",
        ),
        (struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + b"\x80abc\x00", "reserved label"),
    ],
)
def test_malformed_packets_raise_protocol_errors(packet, match):
    with pytest.raises(ProtocolError, match=match):
        MdnsProtocol(A).receive(packet, _addrs(A, "192.168.1.5"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise_anything_but_protocol_errors(data):
    try:
        parse(data)
    except ProtocolError:
        pass


def test_the_query_asks_for_the_libp2p_service():
    is_response, questions, records = parse(build_query())
    assert not is_response and questions == [(SERVICE, 12)] and records == []
