"""The Lattica SDK's DHT values (lattica/dht/_sdk_values.py): bincode 2 ``ValueWithTime``, checked
against bytes a live SDK 1.0.21 node logged for the record it received."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lattica.dht._sdk_values import decode_value, encode_value
from lattica.errors import CodecError


def test_the_bytes_the_sdk_logged():
    """``store("...", b"HELLO", 2000000000.25)`` as SDK 1.0.21 put it on the wire."""
    raw = bytes.fromhex("05" + b"HELLO".hex() + "0000100065cddd41")
    assert encode_value(b"HELLO", 2000000000.25) == raw
    assert decode_value(raw) == (b"HELLO", 2000000000.25)


def test_lengths_past_250_take_bincodes_wide_forms():
    assert encode_value(b"x" * 300, 1.0)[:3] == bytes.fromhex("fb2c01")  # 251, then a u16
    assert encode_value(b"x" * 70_000, 1.0)[:5] == bytes.fromhex("fc70110100")  # 252, then a u32
    assert decode_value(encode_value(b"x" * 70_000, 5.0)) == (b"x" * 70_000, 5.0)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xfe" + bytes(16),  # not a bincode length tag
        b"\x05HELL" + bytes(8),  # shorter than it says
        b"\x01A" + bytes(9),  # longer than it says
        b"\x01A" + struct.pack("<d", float("nan")),
    ],
)
def test_what_is_not_one_is_a_codec_error(raw):
    with pytest.raises(CodecError):
        decode_value(raw)


@given(st.binary(max_size=600), st.floats(allow_nan=False, allow_infinity=False))
def test_round_trip(value, expiration):
    assert decode_value(encode_value(value, expiration)) == (value, expiration)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_a_codec_error(raw):
    try:
        decode_value(raw)
    except CodecError:
        pass
