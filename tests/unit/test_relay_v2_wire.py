"""libp2p circuit relay v2 and DCUtR messages (transports/circuit_v2.py, lattica/nat/_dcutr_wire.py),
issue 50's first piece: the spec's field numbers, round trips, vouchers as signed envelopes, and
malformed input as a ProtocolError only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields
from lattica.errors import ProtocolError
from lattica.nat import _dcutr_wire as dcutr
from lattica.transports import circuit_v2 as relay

A = Multiaddr("/ip4/198.51.100.1/tcp/4001")
B = Multiaddr("/ip4/198.51.100.1/udp/4001/quic-v1")


def test_a_reservation_round_trips_with_its_voucher():
    r, me = KeyPair.generate(), KeyPair.generate()
    voucher = relay.make_voucher(r, me.peer_id, 1_900_000_000)
    msg = relay.HopMessage(
        relay.HopType.STATUS,
        reservation=relay.Reservation(1_900_000_000, (A, B), voucher),
        limit=relay.Limit(120, 131072),
        status=relay.Status.OK,
    )
    got = relay.decode_hop(relay.encode_hop(msg))
    assert got == msg
    assert relay.open_voucher(got.reservation.voucher, r.peer_id, me.peer_id) == 1_900_000_000  # type: ignore[union-attr]


def test_the_fields_are_where_the_spec_puts_them():
    peer = KeyPair.generate().peer_id
    msg = relay.HopMessage(relay.HopType.CONNECT, peer=relay.RelayPeer(peer, (A,)))
    assert relay.encode_hop(msg) == encode_fields(
        [(1, 1), (2, encode_fields([(1, peer.to_bytes()), (2, A.to_bytes())]))]
    )
    stop = relay.StopMessage(relay.StopType.STATUS, limit=relay.Limit(0, 5), status=relay.Status.CONNECTION_FAILED)
    assert relay.encode_stop(stop) == encode_fields([(1, 1), (3, encode_fields([(2, 5)])), (4, 203)])
    assert relay.decode_stop(relay.encode_stop(stop)) == stop


def test_a_voucher_must_be_the_relays_for_this_peer():
    r, me, other = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    voucher = relay.make_voucher(r, me.peer_id, 1)
    with pytest.raises(ProtocolError):
        relay.open_voucher(voucher, other.peer_id, me.peer_id)  # signed by another than the relay
    with pytest.raises(ProtocolError):
        relay.open_voucher(voucher, r.peer_id, other.peer_id)  # for another peer
    forged = relay.make_voucher(other, me.peer_id, 1)  # a third party's voucher "for" the relay
    with pytest.raises(ProtocolError):
        relay.open_voucher(forged, r.peer_id, me.peer_id)
    with pytest.raises(ProtocolError):
        relay.open_voucher(voucher[:-1] + bytes([voucher[-1] ^ 1]), r.peer_id, me.peer_id)


@pytest.mark.parametrize(
    "data",
    [
        encode_fields([(1, 7)]),  # unknown type
        encode_fields([(1, 2), (5, 999)]),  # unknown status
        encode_fields([(1, 1), (2, encode_fields([(1, b"not a peer id")]))]),
        bytes(relay.MAX_MESSAGE + 1),
        b"\xff",
    ],
)
def test_what_is_not_a_hop_message_is_a_protocol_error(data):
    with pytest.raises(ProtocolError):
        relay.decode_hop(data)


def test_dcutr_round_trips_and_keeps_a_few_addresses():
    msg = dcutr.HolePunch(dcutr.PunchType.CONNECT, (A, B))
    assert dcutr.decode(dcutr.encode(msg)) == msg
    assert dcutr.encode(dcutr.HolePunch(dcutr.PunchType.SYNC)) == encode_fields([(1, 300)])
    many = encode_fields([(1, 100)] + [(2, b"\xff\xff")] * 50 + [(2, A.to_bytes())] * 100)
    got = dcutr.decode(many)
    assert got.addrs == (A,) * dcutr.MAX_ADDRS  # unusable ones skipped, not counted; the rest cut
    with pytest.raises(ProtocolError):
        dcutr.decode(encode_fields([(1, 200)]))


@settings(max_examples=300)
@given(st.binary(max_size=256))
def test_any_bytes_decode_or_raise_a_protocol_error(data):
    for decode in (relay.decode_hop, relay.decode_stop, dcutr.decode):
        try:
            decode(data)
        except ProtocolError:
            pass
