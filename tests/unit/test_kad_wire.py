"""libp2p Kademlia's messages (lattica/dht/_libp2p_wire.py): the spec's field numbers, round
trips, what we keep of a peer's answer (bounded; unreadable peers and addresses skipped), and
malformed input as a ProtocolError only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields
from lattica.dht import _libp2p_wire as kad
from lattica.errors import ProtocolError

A = Multiaddr("/ip4/10.0.0.1/tcp/4001")
B = Multiaddr("/ip4/10.0.0.2/udp/4001/quic-v1")


def _peer(*addrs: Multiaddr, connection=kad.ConnectionType.NOT_CONNECTED) -> kad.KadPeer:
    return kad.KadPeer(KeyPair.generate().peer_id, tuple(addrs), connection)


def test_a_find_node_answer_round_trips():
    msg = kad.KadMessage(
        kad.MessageType.FIND_NODE,
        key=b"target",
        closer=(_peer(A, B, connection=kad.ConnectionType.CONNECTED), _peer()),
    )
    assert kad.decode(kad.encode(msg)) == msg


def test_a_record_and_providers_round_trip():
    record = kad.KadRecord(b"/pk/key", b"value", "2026-11-30T00:00:00Z")
    msg = kad.KadMessage(kad.MessageType.GET_VALUE, key=b"/pk/key", record=record, providers=(_peer(A),))
    assert kad.decode(kad.encode(msg)) == msg


def test_the_fields_are_where_the_spec_puts_them():
    peer = _peer(A, connection=kad.ConnectionType.CAN_CONNECT)
    msg = kad.KadMessage(kad.MessageType.GET_PROVIDERS, key=b"k", record=kad.KadRecord(b"rk", b"rv"), providers=(peer,))
    wire_peer = encode_fields([(1, peer.peer.to_bytes()), (2, A.to_bytes()), (3, 2)])
    expected = encode_fields([(1, 3), (2, b"k"), (3, encode_fields([(1, b"rk"), (2, b"rv")])), (9, wire_peer)])
    assert kad.encode(msg) == expected


def test_a_go_style_message_with_fields_we_do_not_use_is_read():
    """clusterLevelRaw (10) is ignored; a publisher (666) that is no PeerId reads as absent."""
    record = encode_fields([(1, b"k"), (2, b"v"), (666, b"someone"), (777, 3600)])
    data = encode_fields([(1, 1), (10, 0), (2, b"k"), (3, record)])
    msg = kad.decode(data)
    assert msg.type is kad.MessageType.GET_VALUE and msg.record == kad.KadRecord(b"k", b"v", ttl=3600)


def test_rusts_publisher_and_ttl_round_trip_at_their_field_numbers():
    """The Lattica SDK stores no record without a publisher: we always send one (field 666)."""
    me = KeyPair.generate().peer_id
    msg = kad.KadMessage(kad.MessageType.PUT_VALUE, b"k", kad.KadRecord(b"k", b"v", publisher=me, ttl=60))
    record = encode_fields([(1, b"k"), (2, b"v"), (666, me.to_bytes()), (777, 60)])
    assert kad.encode(msg) == encode_fields([(1, 0), (2, b"k"), (3, record)])
    assert kad.decode(kad.encode(msg)) == msg


def test_what_we_keep_of_an_answer_is_bounded_and_skips_what_we_cannot_use():
    good = KeyPair.generate().peer_id
    junk_addrs = [b"\xff\xff\x01", encode_fields([(1, b"x")])]  # (an unknown code; not a multiaddr)
    many_addrs = junk_addrs + [Multiaddr(f"/ip4/10.0.0.{i}/tcp/1").to_bytes() for i in range(40)]
    peers = [encode_fields([(1, b"\x99\x99not a peer id")])]  # unreadable: skipped, not counted
    peers += [encode_fields([(1, good.to_bytes())] + [(2, a) for a in many_addrs] + [(3, 9)])]
    peers += [encode_fields([(1, KeyPair.generate().peer_id.to_bytes())]) for _ in range(100)]
    msg = kad.decode(encode_fields([(1, 4)] + [(8, p) for p in peers]))
    assert len(msg.closer) == kad.MAX_PEERS
    first = msg.closer[0]
    assert first.peer == good and len(first.addrs) == kad.MAX_PEER_ADDRS
    assert first.addrs[0] == Multiaddr("/ip4/10.0.0.0/tcp/1")
    assert first.connection is kad.ConnectionType.NOT_CONNECTED  # (an unknown connection type)


def test_what_we_write_stays_within_rust_libp2ps_packet():
    closer = tuple(_peer(*(Multiaddr(f"/ip4/10.0.{i}.{j}/tcp/4001") for j in range(32))) for i in range(64))
    out = kad.encode(kad.KadMessage(kad.MessageType.FIND_NODE, key=b"k", closer=closer))
    assert len(out) <= kad.MAX_WRITE
    kept = kad.decode(out).closer
    assert 0 < len(kept) < len(closer)  # (the last ones left out)
    assert [p.peer for p in kept] == [p.peer for p in closer[: len(kept)]]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x08\x07", "unknown Kademlia message type"),
        (encode_fields([(1, 1), (2, b"k" * 1025)]), "key must be"),
        (encode_fields([(1, 1), (3, 5)]), "record must be a message"),
        (b"\x12\x05ab", "malformed"),
        (b"\x0d\x00\x00\x00\x00", "malformed"),  # (a fixed32 field: kad has none)
        (b"\x08" * (kad.MAX_MESSAGE + 1), "at most"),
    ],
)
def test_malformed_messages_are_protocol_errors(data, reason):
    with pytest.raises(ProtocolError, match=reason):
        kad.decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_protocol_errors(data):
    try:
        kad.decode(data)
    except ProtocolError:
        pass
