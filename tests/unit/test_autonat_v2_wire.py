"""AutoNAT v2's messages (lattica/nat/_autonat_v2_wire.py): the spec's field numbers, the fixed64
nonce, round trips, and malformed input as a ProtocolError only."""

from __future__ import annotations

import pytest

from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, fixed64
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v2_wire as w

ADDRS = (Multiaddr("/ip4/203.0.113.5/tcp/4001"), Multiaddr("/ip4/203.0.113.5/udp/4001/quic-v1"))


@pytest.mark.parametrize(
    "msg",
    [
        w.DialRequest(ADDRS, 2**64 - 1),
        w.DialRequest((), 0),
        w.DialResponse(w.ResponseStatus.OK, 1, w.DialStatus.OK),
        w.DialResponse(w.ResponseStatus.E_DIAL_REFUSED),
        w.DialDataRequest(0, 40_000),
        w.DialDataResponse(b"x" * 4096),
    ],
)
def test_round_trips(msg) -> None:
    assert w.decode(w.encode(msg)) == msg


def test_the_nonce_is_a_fixed64_at_field_2_of_a_dial_request_at_field_1() -> None:
    inner = encode_fields([(1, ADDRS[0].to_bytes())]) + fixed64(2, 0x0102030405060708)
    data = encode_fields([(1, inner)])
    assert w.encode(w.DialRequest(ADDRS[:1], 0x0102030405060708)) == data
    assert w.decode_dial_back(w.encode_dial_back(7)) == 7
    assert w.encode_dial_back(7) == b"\x09" + (7).to_bytes(8, "little")


def test_unusable_addresses_are_skipped_and_at_most_16_kept() -> None:
    junk = encode_fields([(1, b"\xff\xff\xff")])
    many = b"".join(encode_fields([(1, Multiaddr(f"/ip4/203.0.113.{i}/tcp/1").to_bytes())]) for i in range(40))
    data = encode_fields([(1, junk + many + fixed64(2, 5))])
    msg = w.decode(data)
    assert isinstance(msg, w.DialRequest) and len(msg.addrs) == 16 and msg.nonce == 5


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # truncated
        encode_fields([(1, encode_fields([(1, b"a")]))]),  # a DialRequest without its nonce
        encode_fields([(2, encode_fields([(1, 7)]))]),  # an unknown response status
        encode_fields([(1, b""), (3, b"")]),  # two kinds at once
        encode_fields([(9, b"")]),  # no kind we know
        encode_fields([(4, encode_fields([(1, b"x" * 4097)]))]),  # dial data over 4 KiB a message
        b"\x0a" + b"\x80\x40" + b"x" * 8192,  # over the cap
    ],
)
def test_malformed_messages_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        w.decode(data)


def test_a_dial_back_without_a_nonce_is_refused() -> None:
    for data in (b"", encode_fields([(1, 5)]), b"\x09\x01"):
        with pytest.raises(ProtocolError):
            w.decode_dial_back(data)
