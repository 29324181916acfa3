"""The protobuf reader (lattica/_protobuf.py): varint, length-delimited and, where the caller's
message has them, fixed-width fields (AutoNAT v2's nonce is a fixed64); groups, truncation and
fixed fields where none are expected as ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lattica._protobuf import decode_fields, decode_repeated, encode_fields, fixed64, uvarint


def test_fixed_width_fields_are_read_as_unsigned_little_endian():
    msg = encode_fields([(1, b"addr")]) + fixed64(2, 0x0102030405060708) + uvarint(3 << 3 | 5) + bytes([1, 0, 0, 0x80])
    assert decode_fields(msg, fixed=True) == {1: b"addr", 2: 0x0102030405060708, 3: 0x80000001}
    assert decode_repeated(msg + encode_fields([(1, b"more")]), 1, fixed=True) == [b"addr", b"more"]
    with pytest.raises(ValueError):  # (a message with no fixed fields: one must not pass for a varint)
        decode_fields(msg)


@pytest.mark.parametrize(
    "data",
    [
        uvarint(1 << 3 | 3),  # a group (deprecated)
        uvarint(1 << 3 | 1) + bytes(7),  # a fixed64 cut short
        uvarint(1 << 3 | 5) + bytes(3),
        uvarint(1 << 3 | 2) + uvarint(5) + b"abc",
    ],
)
def test_groups_and_truncation_are_value_errors(data):
    with pytest.raises(ValueError):
        decode_fields(data, fixed=True)
    with pytest.raises(ValueError):
        decode_repeated(data, 1, fixed=True)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_fixed64_round_trips(n):
    assert decode_fields(fixed64(9, n), fixed=True) == {9: n}
