"""Bitswap 1.2.0's messages (lattica/content/_bitswap_wire.py): the spec's field numbers, round
trips, blocks named by the hash of their data (never by what a peer claims), bounds, and
malformed input as a ProtocolError only."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._protobuf import encode_fields
from lattica.content import _bitswap_wire as bs
from lattica.content._cid import DAG_PB, RAW, Cid
from lattica.errors import ProtocolError

A, B = Cid.of(b"a"), Cid.of(b"b", DAG_PB)


def test_a_message_round_trips():
    msg = bs.BitswapMessage(
        wants=(bs.Want(A, have=True), bs.Want(B, cancel=True, send_dont_have=False, priority=7)),
        full=True,
        blocks=((A, b"a"),),
        haves=(B,),
        dont_haves=(A,),
    )
    assert bs.decode(bs.encode(msg)) == msg


def test_the_fields_are_where_the_spec_puts_them():
    msg = bs.BitswapMessage(wants=(bs.Want(A, have=True),), blocks=((A, b"a"),), dont_haves=(B,))
    entry = encode_fields([(1, A.bytes), (2, 1), (4, 1), (5, 1)])
    block = encode_fields([(1, bytes([1, RAW, 0x12, 32])), (2, b"a")])
    presence = encode_fields([(1, B.bytes), (2, 1)])
    assert bs.encode(msg) == encode_fields([(1, encode_fields([(1, entry)])), (3, block), (4, presence)])


def test_a_block_is_named_by_its_data_not_by_a_claim():
    """A block whose data is not what the peer wanted comes out under its own CID (and so
    matches no want); a CIDv0 prefix (version 0, dag-pb) is read too."""
    forged = encode_fields([(3, encode_fields([(1, bytes([1, RAW, 0x12, 32])), (2, b"other bytes")]))])
    ((cid, data),) = bs.decode(forged).blocks
    assert cid == Cid.of(b"other bytes") and cid != A
    v0 = encode_fields([(3, encode_fields([(1, bytes([0, DAG_PB, 0x12, 32])), (2, b"node")]))])
    assert bs.decode(v0).blocks[0][0] == Cid(DAG_PB, hashlib.sha256(b"node").digest())


@pytest.mark.parametrize(
    "prefix",
    [bytes([1, RAW, 0x13, 64]), bytes([1, RAW, 0x12, 20]), bytes([0, RAW, 0x12, 32]), bytes([2, RAW, 0x12, 32])],
)
def test_blocks_and_wants_we_cannot_use_are_skipped(prefix):
    msg = encode_fields(
        [
            (1, encode_fields([(1, encode_fields([(1, b"\x01\x71\x12\x20" + bytes(32))]))])),  # dag-cbor CID
            (3, encode_fields([(1, prefix), (2, b"x")])),
        ]
    )
    got = bs.decode(msg)
    assert got.wants == () and got.blocks == ()


def test_over_the_caps_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        bs.decode(bytes(bs.MAX_MESSAGE + 1))
    many = encode_fields([(4, encode_fields([(1, A.bytes), (2, 0)]))] * (bs.MAX_ITEMS + 1))
    with pytest.raises(ProtocolError):
        bs.decode(many)
    entries = encode_fields([(1, encode_fields([(1, A.bytes)]))] * (bs.MAX_ITEMS + 1))
    with pytest.raises(ProtocolError):
        bs.decode(encode_fields([(1, entries)]))


@settings(max_examples=300)
@given(st.binary(max_size=512))
def test_any_bytes_decode_or_raise_a_protocol_error(data):
    try:
        bs.decode(data)
    except ProtocolError:
        pass


def test_a_cidv0_want_is_answered_under_its_v0_name():
    """go matches answers to wants by the exact CID: a want for ``Qm...`` gets a HAVE naming the
    bare multihash and a block whose prefix says version 0."""
    node = Cid.of(b"a dag-pb node", DAG_PB)
    v0_name = node.bytes[-34:]
    msg = encode_fields([(1, encode_fields([(1, encode_fields([(1, v0_name), (4, 1)]))]))])
    (want,) = bs.decode(msg).wants
    assert want.cid == node and want.v0 and want.name.bytes == v0_name
    answer = bs.encode(bs.BitswapMessage(blocks=((want.name, b"a dag-pb node"),), haves=(want.name,)))
    block = encode_fields([(1, bytes([0, DAG_PB, 0x12, 32])), (2, b"a dag-pb node")])
    assert answer == encode_fields([(3, block), (4, encode_fields([(1, v0_name), (2, 0)]))])
    got = bs.decode(answer)
    assert got.blocks[0][0] == node and got.haves == (node,)


def test_the_service_serves_the_codecs_protocol():
    """(The service names it without loading the codec at start: the codec loads hashlib.)"""
    from lattica.actors.content.bitswap import PROTOCOL  # (as the docstring says)

    assert PROTOCOL == bs.PROTOCOL == "/ipfs/bitswap/1.2.0"
