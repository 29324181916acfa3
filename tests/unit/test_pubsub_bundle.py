"""Signed bundles of pub-sub messages (actors/pubsub/bundle.py): what the wire may carry, what
an author signs, and what a message id covers."""

from __future__ import annotations

import pytest

from lattica.actors.pubsub.bundle import MAX_ITEMS, Bundle
from lattica.errors import ProtocolError


def test_round_trip():
    b = Bundle([b"a", b"bb", b"ccc"])
    assert b.size == 6 and b.count == 3
    again = Bundle.from_wire(list(b.wire()), 100)
    assert (
        again.items == b.items
        and again.root == b.root
        and again.digest("t", b"a", 1, b"s") == b.digest("t", b"a", 1, b"s")
    )


def test_ids_cover_the_signature_and_every_item():
    b = Bundle([b"a", b"b"])
    assert b.digest("t", b"a", 1, b"sig") != b.digest("t", b"a", 1, b"other")
    assert (
        b.digest("t", b"a", 1, b"sig")
        != Bundle([b"a", b"c"]).digest("t", b"a", 1, b"sig")
        != Bundle([b"b", b"a"]).digest("t", b"a", 1, b"sig")
    )
    assert b.digest("t", b"a", 1, b"sig") != b.digest("u", b"a", 1, b"sig"), (
        "the topic too: a relabelled copy is another message"
    )


def test_signed_bytes_separate_every_field_and_keep_the_order():
    b = Bundle([b"x", b"y"])
    assert b.signed_bytes("t", b"ab", 1) != b.signed_bytes("ta", b"b", 1)
    assert b.signed_bytes("t", b"a", 1) != b.signed_bytes("t", b"a", 2)
    assert b.signed_bytes("t", b"a", 1) != b.signed_bytes("u", b"a", 1)
    assert b.signed_bytes("t", b"a", 1) != Bundle([b"y", b"x"]).signed_bytes("t", b"a", 1)
    assert b.signed_bytes("t", b"a", 1) != Bundle([b"x"]).signed_bytes("t", b"a", 1)
    assert b.signed_bytes("t", b"a", 1) != Bundle([b"xy"]).signed_bytes("t", b"a", 1)


def test_large_items_arriving_as_views_of_the_frame_are_copied_out():
    data = bytearray(b"z" * 100_000)
    b = Bundle.from_wire([memoryview(data)], 200_000)
    data[0] = 0
    assert b.items[0] == b"z" * 100_000 and type(b.items[0]) is bytes


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "x",
        [b"a"] * (MAX_ITEMS + 1),
        [1],
        [[b"x" * 32]],
        [b"a" * 60, b"b" * 60],
        [memoryview(b"a" * 101)],
        [b"a" * 50, memoryview(b"a" * 51)],
        ["text"],
        [bytearray(b"x")],
    ],
)
def test_malformed_item_lists_are_refused(raw):
    with pytest.raises(ProtocolError):
        Bundle.from_wire(raw, 100)


def test_certificates_that_are_no_list_are_refused():
    """(found by the fuzzer in CI: a falsy non-list, e.g. None, passed and broke later readers)"""
    for bad in (None, 0, "", b"", False, {}):
        with pytest.raises(ProtocolError):
            Bundle.from_wire([b"x"], 100, bad)
    assert Bundle.from_wire([b"x"], 100, []).certs == []


def test_a_flood_set_is_signed_and_a_bundle_without_one_signs_as_before():
    plain = Bundle([b"x"])
    tags = [bytes([i]) * 8 for i in range(3)]
    flooded = Bundle([b"x"], (), tags)
    assert plain.signed_bytes("t", b"a", 1).startswith(b"lattica pubsub v2\x00"), (
        "no flood set: the bytes older nodes sign"
    )
    assert flooded.signed_bytes("t", b"a", 1).startswith(b"lattica pubsub v3\x00")
    assert flooded.signed_bytes("t", b"a", 1) != Bundle([b"x"], (), tags[:2]).signed_bytes("t", b"a", 1), (
        "a tag added or removed changes what is signed"
    )
    assert flooded.signed_bytes("t", b"a", 1) != Bundle([b"x"], (), [tags[0], tags[1], b"\x09" * 8]).signed_bytes(
        "t", b"a", 1
    )
    again = Bundle.from_wire([b"x"], 10, [], list(tags))
    assert again.signed_bytes("t", b"a", 1) == flooded.signed_bytes("t", b"a", 1)


@pytest.mark.parametrize("flooded", ["x", [], [b"short"], [b"x" * 9], [b"y" * 8] * 65, [1] * 3])
def test_malformed_flood_sets_are_refused(flooded):
    with pytest.raises(ProtocolError, match="flood set"):
        Bundle.from_wire([b"x"], 10, [], flooded)


def test_ids_cover_the_certificates_and_the_flood_set():
    sig = b"s" * 64
    x6 = b"x" * 6
    bundles = [
        Bundle([b"x"]),
        Bundle([b"x"], [b"c" * 8]),
        Bundle([b"x"], [b"c" * 8, b"c" * 8]),
        Bundle([b"x"], [], [b"c" * 8]),
        Bundle([b"x"], [b"c" * 8], [b"c" * 8]),
        Bundle([b"x"], [], [b"d" * 8]),
        Bundle([b"x"], [x6]),
        Bundle([b"x"], [], [b"\x06" + x6 + b"\x01"]),
    ]  # (a count after the list would let these two collide)
    assert len({b.digest("t", b"a", 1, sig) for b in bundles}) == len(bundles)
