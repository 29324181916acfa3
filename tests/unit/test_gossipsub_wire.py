"""GossipSub's RPC (lattica/pubsub/_gossipsub_wire.py), sans-IO: round trips, StrictSign
signatures made and checked, and malformed or oversized RPCs as a ProtocolError only."""

from __future__ import annotations

import dataclasses

import pytest

from lattica._identity import KeyPair
from lattica._protobuf import encode_fields
from lattica.errors import ProtocolError
from lattica.pubsub import _gossipsub_wire as g


def test_an_rpc_round_trips() -> None:
    kp, other = KeyPair.generate(), KeyPair.generate()
    m = g.sign(kp, "blocks", b"hello", (7).to_bytes(8, "big"))
    rpc = g.RPC(
        (g.SubOpts(True, "blocks"), g.SubOpts(False, "old")),
        (m,),
        g.Control(
            ihave=(g.IHave("blocks", (b"id1", b"id2")),),
            iwant=(b"id3",),
            graft=("blocks",),
            prune=(g.Prune("old", (other.peer_id,), 60),),
            idontwant=(b"id4",),
        ),
    )
    assert g.decode(g.encode(rpc)) == rpc
    assert g.decode(b"") == g.RPC()


def test_strictsign_signs_the_message_without_signature_and_key() -> None:
    kp = KeyPair.generate()
    m = g.sign(kp, "t", b"data", b"\x00" * 7 + b"\x01")
    assert m.key == b""  # an Ed25519 PeerId inlines its key
    signed = encode_fields([(1, kp.peer_id.to_bytes()), (2, b"data"), (3, m.seqno), (4, b"t")])
    assert kp.sign(g.SIGN_PREFIX + signed) == m.signature  # (Ed25519 is deterministic)
    g.verify(g.decode(g.encode(g.RPC(publish=(m,)))).publish[0])
    # the key may also travel in the message, if it is the author's
    g.verify(dataclasses.replace(m, key=kp.public_key_protobuf()))
    assert g.default_id(m) == kp.peer_id.to_bytes() + m.seqno


@pytest.mark.parametrize(
    "change",
    [
        {"data": b"datA"},
        {"topic": "u"},
        {"seqno": b"\x00" * 8},
        {"signature": b""},
        {"author": None},
        {"key": KeyPair.generate().public_key_protobuf()},  # another's key
        {"key": b"\x08\x09"},  # an unusable key
    ],
)
def test_a_changed_or_unsigned_message_does_not_verify(change: dict) -> None:
    m = g.sign(KeyPair.generate(), "t", b"data", b"\x00" * 7 + b"\x01")
    with pytest.raises(ProtocolError):
        g.verify(dataclasses.replace(m, **change))


def test_another_authors_signature_does_not_verify() -> None:
    a, b = KeyPair.generate(), KeyPair.generate()
    m = g.sign(a, "t", b"x", b"\x01")
    with pytest.raises(ProtocolError):
        g.verify(dataclasses.replace(m, author=b.peer_id))


def _ids(n: int) -> bytes:
    return encode_fields([(1, b"i%d" % i) for i in range(n)])


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # truncated
        b"\x0a" + b"\x80\x80\x40" + b"x",  # a length past the end
        encode_fields([(2, encode_fields([(4, b"\xff\xfe")]))]),  # a topic that is not UTF-8
        encode_fields([(2, encode_fields([(1, b"\x00\x99"), (4, b"t")]))]),  # no valid author
        encode_fields([(1, encode_fields([(2, b"t" * 1025)]))]),  # a topic over 1 KiB
        encode_fields([(3, encode_fields([(2, _ids(5001))]))]),  # an IWANT of 5,001 ids
        encode_fields([(3, encode_fields([(2, _ids(3000)), (2, _ids(3000))]))]),  # 6,000 ids in two
        b"\x12\x00" * (g.MAX_RPC // 2 + 1),  # over 1 MiB
    ],
)
def test_malformed_or_oversized_rpcs_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        g.decode(data)


def test_skim_counts_an_rpcs_messages_from_its_top_level_fields_each_counted() -> None:
    kp = KeyPair.generate()
    m = g.sign(kp, "t", b"x", bytes(8))
    rpc = g.RPC((g.SubOpts(True, "t"),), (m, m, m), g.Control(graft=("t",)))
    rd = g.Reader()
    assert g.skim(g.encode(rpc), rd) == 3
    assert rd.read == 5  # (a subscription, three messages, the control)
    assert g.skim(g.encode(g.RPC(subscriptions=(g.SubOpts(True, "t"),))), g.Reader()) == 0
    with pytest.raises(ProtocolError):
        g.skim(b"\x12\x05ab", g.Reader())  # (a message longer than the RPC)


def test_a_readers_share_ends_reading_with_spent_and_the_cap_with_a_protocol_error() -> None:
    """A share (a stranger's) smaller than MAX_FIELDS: past it, Spent (not the peer's error);
    without one, MAX_FIELDS is the malformation cap it always was."""
    rpc = g.encode(g.RPC(control=g.Control(graft=tuple(f"t{i}" for i in range(100)))))
    rd = g.Reader(150)
    with pytest.raises(g.Spent):
        g.decode(rpc, rd)
    assert rd.read == 150
    rd = g.Reader(1000)
    assert len(g.decode(rpc, rd).control.graft) == 100
    assert rd.read == 201  # (the control, then each GRAFT and its topic)
    with pytest.raises(g.Spent):
        g.skim(rpc, g.Reader(0))
    dense = encode_fields([(1, encode_fields([(1, 1)] * 2))] * 2) + b"\x38\x00" * g.MAX_FIELDS
    with pytest.raises(ProtocolError):
        g.decode(dense, g.Reader(10 * g.MAX_FIELDS))
