"""The Lattica SDK's RPC messages (bincode 2, standard config), as lattica/bench/_peers/sdk_rpc.py
writes and reads them for the rust-libp2p interop test and ``lattica bench libp2p`` (issue 48)."""

import pytest

from lattica.bench._peers import sdk_rpc


def test_a_request_is_its_variant_then_length_prefixed_fields_then_no_compression():
    head, tail = sdk_rpc.request_frame("a", "Echo.sink", 3)
    assert head + b"xyz" + tail == b"\x00\x01a\x09Echo.sink\x03xyz\x00"
    got = sdk_rpc.decode_message(head + b"xyz" + tail)
    assert got["kind"] == "request" and got["id"] == "a" and got["method"] == "Echo.sink"
    assert bytes(got["data"]) == b"xyz" and got["compression"] is None


@pytest.mark.parametrize(
    ("size", "prefix"),
    [
        (250, b"\xfa"),
        (251, b"\xfb\xfb\x00"),
        (1 << 16, b"\xfc\x00\x00\x01\x00"),
        (1 << 32, b"\xfd" + (1 << 32).to_bytes(8, "little")),
    ],
)
def test_lengths_are_bincode_varints(size, prefix):
    head, _ = sdk_rpc.request_frame("", "", size)
    assert head == b"\x00\x00\x00" + prefix


def test_a_response_and_an_error_read_back():
    got = sdk_rpc.decode_message(sdk_rpc.response_frame("id-1", b"k"))
    assert got == {"kind": "response", "id": "id-1", "data": got["data"], "compression": None}
    assert bytes(got["data"]) == b"k"
    assert sdk_rpc.decode_message(b"\x02\x01x\x04oops") == {"kind": "error", "id": "x", "error": "oops"}
    compressed = sdk_rpc.decode_message(b"\x01\x01x\x01k\x01\x02")  # (Some(Zstd))
    assert compressed["compression"] == 2


@pytest.mark.parametrize(
    "bad",
    [
        b"",  # nothing
        b"\x03\x00",  # no such variant
        b"\x01\x01x\x05k\x00",  # data runs past the end
        b"\x01\x01x\x01k",  # no compression tag
        b"\x01\x01x\x01k\x02",  # a bad Option tag
        b"\x01\x01x\x01k\x00\x00",  # a byte after the message
        b"\x01\xff",  # a bad varint marker
    ],
)
def test_a_malformed_message_is_a_value_error(bad):
    with pytest.raises(ValueError):
        sdk_rpc.decode_message(bad)
