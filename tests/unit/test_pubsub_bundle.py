"""Signed bundles of pub-sub messages (actors/pubsub/bundle.py): what the wire may carry, what
an author signs, and what a message id covers."""

from __future__ import annotations

import hashlib

import pytest

from lattica.actors.pubsub.bundle import DIGEST, MAX_ITEMS, Bundle
from lattica.errors import ProtocolError


def test_round_trip_and_left_out_items_keep_the_signed_digests():
    b = Bundle.of([b"a", b"bb", b"ccc"])
    assert b.size == 6 and b.present() == [0, 1, 2]
    again = Bundle.from_wire(list(b.wire()), 100)
    assert again.items == b.items and again.root == b.root
    part = b.keeping([1])
    assert part.items == (None, b"bb", None) and part.size == 2
    assert part.wire() == [[hashlib.sha256(b"a").digest()], b"bb", [hashlib.sha256(b"ccc").digest()]]
    back = Bundle.from_wire(part.wire(), 100)
    assert back.root == b.root and back.present() == [1]
    assert back.signed_bytes("t", b"me", 7) == b.signed_bytes("t", b"me", 7), "what remains verifies under the author's signature"


def test_ids_cover_the_signature_and_what_was_left_out():
    b = Bundle.of([b"a", b"b"])
    assert b.digest(b"sig") != b.digest(b"other")
    assert b.digest(b"sig") != b.keeping([0]).digest(b"sig") != b.keeping([1]).digest(b"sig")
    assert Bundle.from_wire(b.keeping([0]).wire(), 10).digest(b"sig") == b.keeping([0]).digest(b"sig")


def test_signed_bytes_separate_every_field_and_keep_the_order():
    b = Bundle.of([b"x", b"y"])
    assert b.signed_bytes("t", b"ab", 1) != b.signed_bytes("ta", b"b", 1)
    assert b.signed_bytes("t", b"a", 1) != b.signed_bytes("t", b"a", 2)
    assert b.signed_bytes("t", b"a", 1) != Bundle.of([b"y", b"x"]).signed_bytes("t", b"a", 1)
    assert b.signed_bytes("t", b"a", 1) != Bundle.of([b"x"]).signed_bytes("t", b"a", 1)


def test_large_items_arriving_as_views_of_the_frame_are_copied_out():
    data = bytearray(b"z" * 100_000)
    b = Bundle.from_wire([memoryview(data)], 200_000)
    data[0] = 0
    assert b.items[0] == b"z" * 100_000 and type(b.items[0]) is bytes


@pytest.mark.parametrize("raw", [
    [], "x", [b"a"] * (MAX_ITEMS + 1), [1], [[b"x" * (DIGEST - 1)]], [[b"x" * DIGEST, b""]], [[b"x" * DIGEST]],
    [[b"x" * DIGEST], [b"y" * DIGEST]], [b"a" * 60, b"b" * 60], [memoryview(b"a" * 101)], ["text"],
])
def test_malformed_item_lists_are_refused(raw):
    with pytest.raises(ProtocolError):
        Bundle.from_wire(raw, 100)
