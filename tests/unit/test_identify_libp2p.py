"""Identify as libp2p defines it (lattica/_identify.py, ``encode_libp2p``/``parse_libp2p``): the
protobuf message, the 4 KiB cap, addresses we cannot read skipped, and hostile messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identify import LIBP2P_MAX_MESSAGE, encode_libp2p, parse_libp2p
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, uvarint
from lattica.errors import ProtocolError

ME = KeyPair.generate()
TCP = Multiaddr("/ip4/127.0.0.1/tcp/4001")
QUIC = Multiaddr("/ip4/127.0.0.1/udp/4001/quic-v1")


def test_a_message_round_trips():
    raw = encode_libp2p(
        ME.public_key_protobuf(), "lattica/0.1.0", "/lattica/1.0.0", [TCP, QUIC], TCP, ["/ipfs/ping/1.0.0"]
    )
    got = parse_libp2p(raw, ME.peer_id)
    assert got["listen_addrs"] == (TCP, QUIC) and got["observed_addr"] == TCP
    assert got["protocols"] == ("/ipfs/ping/1.0.0",)
    assert got["agent_version"] == "lattica/0.1.0" and got["protocol_version"] == "/lattica/1.0.0"


def test_the_fields_are_where_the_spec_puts_them():
    raw = encode_libp2p(ME.public_key_protobuf(), "a", "p", [TCP], None, ["/x"])
    # publicKey = 1, protocolVersion = 5, agentVersion = 6, listenAddrs = 2, protocols = 3
    assert raw.startswith(b"\x0a" + uvarint(len(ME.public_key_protobuf())) + ME.public_key_protobuf())
    assert b"\x2a\x01p" in raw and b"\x32\x01a" in raw and b"\x1a\x02/x" in raw
    assert b"\x12" + uvarint(len(TCP.to_bytes())) + TCP.to_bytes() in raw


def test_addresses_we_cannot_read_are_skipped_not_fatal():
    websocket = TCP.to_bytes() + uvarint(477)  # /ip4/127.0.0.1/tcp/4001/ws
    webtransport = QUIC.to_bytes() + uvarint(465) + uvarint(466) + uvarint(3) + b"abc"
    raw = encode_fields(
        [(1, ME.public_key_protobuf()), (2, websocket), (2, TCP.to_bytes()), (2, webtransport), (4, websocket)]
    )
    got = parse_libp2p(raw, ME.peer_id)
    assert got["listen_addrs"] == (TCP,) and got["observed_addr"] is None


def test_our_message_fits_what_rust_libp2p_accepts():
    many = [Multiaddr(f"/ip4/10.0.{i // 250}.{i % 250}/tcp/{4000 + i}") for i in range(400)]
    raw = encode_libp2p(ME.public_key_protobuf(), "a", "p", many, TCP, [f"/proto/{i}/1.0.0" for i in range(400)])
    assert len(raw) <= LIBP2P_MAX_MESSAGE
    assert len(parse_libp2p(raw, ME.peer_id)["listen_addrs"]) > 0


def test_a_message_over_the_cap_or_from_another_key_or_malformed_is_refused():
    too_big = encode_fields([(1, ME.public_key_protobuf())] + [(2, TCP.to_bytes())] * 1000)
    with pytest.raises(ProtocolError, match="bytes"):
        parse_libp2p(too_big, ME.peer_id)
    with pytest.raises(ProtocolError, match="does not match"):
        parse_libp2p(encode_libp2p(ME.public_key_protobuf(), "a", "p", [], None, []), KeyPair.generate().peer_id)
    with pytest.raises(ProtocolError):
        parse_libp2p(b"\x0a\xff", ME.peer_id)
    with pytest.raises(ProtocolError, match="public key"):
        parse_libp2p(encode_fields([(2, TCP.to_bytes())]), ME.peer_id)


def test_many_short_addresses_are_capped():
    raw = encode_fields([(1, ME.public_key_protobuf())] + [(2, TCP.to_bytes())] * 300)
    assert len(parse_libp2p(raw, ME.peer_id)["listen_addrs"]) == 64


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_raise_only_protocol_errors(data):
    try:
        parse_libp2p(data, ME.peer_id)
    except ProtocolError:
        pass
