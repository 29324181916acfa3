"""AutoNAT v1's messages (lattica/nat/_autonat_v1_wire.py): go-libp2p's field numbers and status
codes, round trips, the bounds on what we read, and malformed input as a ProtocolError only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v1_wire as w

PID = KeyPair.generate().peer_id.to_bytes()
ADDRS = (Multiaddr("/ip4/203.0.113.5/tcp/4001"), Multiaddr("/ip6/2001:db8::1/udp/4001/quic-v1"))


@pytest.mark.parametrize(
    "msg",
    [
        w.Dial(PID, ADDRS),
        w.Dial(PID, ()),
        w.DialResponse(w.Status.OK, addr=ADDRS[0]),
        w.DialResponse(w.Status.E_DIAL_REFUSED, "no address at the IP your connection comes from"),
        w.DialResponse(w.Status.E_INTERNAL_ERROR),
    ],
)
def test_round_trips(msg) -> None:
    assert w.decode(w.encode(msg)) == msg


def test_the_wire_is_go_libp2ps() -> None:
    """Message{type=1, dial=2{peer=1{id=1, addrs=2}}, dialResponse=3{status=1, statusText=2, addr=3}},
    with the type and an OK status written out (proto2: present, not defaulted)."""
    peer = encode_fields([(1, PID), (2, ADDRS[0].to_bytes())])
    assert w.encode(w.Dial(PID, ADDRS[:1])) == encode_fields([(1, 0), (2, encode_fields([(1, peer)]))])
    ok = encode_fields([(1, 0), (3, ADDRS[0].to_bytes())])
    assert w.encode(w.DialResponse(w.Status.OK, addr=ADDRS[0])) == encode_fields([(1, 1), (3, ok)])
    assert [s.value for s in w.Status] == [0, 100, 101, 200, 300]
    # a DIAL without its type field is a DIAL (proto2's default)
    assert w.decode(encode_fields([(2, encode_fields([(1, peer)]))])) == w.Dial(PID, ADDRS[:1])


def test_unusable_addresses_are_skipped_and_at_most_16_kept() -> None:
    many = [(2, Multiaddr(f"/ip4/203.0.113.{i}/tcp/1").to_bytes()) for i in range(40)]
    peer = encode_fields([(1, PID), (2, b"\xff\xff\xff"), *many])
    msg = w.decode(encode_fields([(1, 0), (2, encode_fields([(1, peer)]))]))
    assert isinstance(msg, w.Dial) and len(msg.addrs) == w.MAX_ADDRS == 16
    assert msg.addrs[0] == Multiaddr("/ip4/203.0.113.0/tcp/1")


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # truncated
        encode_fields([(1, 0)]),  # a DIAL without its dial
        encode_fields([(1, 0), (2, b"")]),  # a dial without its peer
        encode_fields([(1, 0), (2, encode_fields([(1, 5)]))]),  # a peer that is a number
        encode_fields([(1, 0), (2, encode_fields([(1, encode_fields([(1, 7)]))]))]),  # an id that is a number
        encode_fields([(1, 1)]),  # a DIAL_RESPONSE without its response
        encode_fields([(1, 1), (3, encode_fields([(1, 42)]))]),  # an unknown status
        encode_fields([(1, 1), (3, encode_fields([(1, 0), (3, b"\xff\xff")]))]),  # a malformed address
        encode_fields([(1, 1), (3, encode_fields([(2, 9)]))]),  # a status text that is a number
        encode_fields([(1, 7)]),  # an unknown type
        encode_fields([(1, b"x")]),  # a type that is bytes
        b"\x09" + bytes(8),  # a fixed64 (no field of v1 is one)
        encode_fields([(2, b"x" * 9000)]),  # over the cap
    ],
)
def test_malformed_messages_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        w.decode(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=256), st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), max_size=4))
def test_any_bytes_are_a_message_or_a_protocol_error(data: bytes, flips: list[tuple[int, int]]) -> None:
    """Random bytes, and a valid request with a few bytes changed."""
    valid = bytearray(w.encode(w.Dial(PID, ADDRS)))
    for i, b in flips:
        valid[i % len(valid)] = b
    for raw in (data, bytes(valid)):
        try:
            w.decode(raw)
        except ProtocolError:
            pass
