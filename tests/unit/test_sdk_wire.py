"""The Lattica SDK's RPC on the wire (lattica/sdk/_wire.py), sans-IO: bincode 2 ``RpcMessage``
(``/rpc/req-resp/1.0.0``) and length-framed ``StreamFrame`` (``/rpc/stream/1.0.0``), byte for byte
as the SDK 1.0.21 writes them (its ``rpc/protocol.rs``), malformed input refused with
ProtocolError, and the pickle check."""

import pickle

import pytest

from lattica.errors import FrameTooLarge, ProtocolError
from lattica.sdk import _wire as w


def test_a_request_is_its_variant_then_length_prefixed_fields_then_no_compression():
    raw = w.encode_message(w.Request("a", "Echo.sink", b"xyz"))
    assert raw == b"\x00\x01a\x09Echo.sink\x03xyz\x00"
    head, tail = w.request_parts("a", "Echo.sink", 3)
    assert head + b"xyz" + tail == raw
    assert w.decode_message(raw) == w.Request("a", "Echo.sink", b"xyz", None)


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
    head, _ = w.request_parts("", "", size)
    assert head == b"\x00\x00\x00" + prefix


def test_a_response_and_an_error_read_back():
    assert w.decode_message(w.encode_message(w.Response("id-1", b"k"))) == w.Response("id-1", b"k")
    assert w.decode_message(b"\x02\x01x\x04oops") == w.Failure("x", "oops")
    assert w.decode_message(b"\x01\x01x\x01k\x01\x02") == w.Response("x", b"k", 2)  # (Some(Zstd))


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
        b"\x02\x01x\x02\xff\xfe",  # an error that is not UTF-8
        b"\x02\x01x\xfc" + (5000).to_bytes(4, "little") + b"e" * 5000,  # an error over 4 KiB
    ],
)
def test_a_malformed_message_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError):
        w.decode_message(bad)


FRAMES = [
    w.StreamRequest("r1", "Echo.count", b""),
    w.Data("r1", b"5", True),
    w.Data("r1", b"", False),
    w.Failure("r1", "Service X not found"),
    w.Close("r1"),
    w.Cancel("r1"),
]


@pytest.mark.parametrize("frame", FRAMES)
def test_each_stream_frame_reads_back(frame):
    raw = w.encode_frame(frame)
    assert int.from_bytes(raw[:4], "big") == len(raw) - 4
    assert w.decode_frame(raw[4:]) == frame


def test_stream_frames_byte_for_byte():
    assert w.encode_frame(w.StreamRequest("i", "S.m")) == b"\x00\x00\x00\x08\x00\x01i\x03S.m\x00"
    assert w.encode_frame(w.Data("i", b"ab", True)) == b"\x00\x00\x00\x07\x01\x01i\x02ab\x01"
    assert w.encode_frame(w.Close("i")) == b"\x00\x00\x00\x03\x03\x01i"


def test_frames_split_a_stream_wherever_it_was_cut():
    stream = b"".join(w.encode_frame(f) for f in FRAMES)
    for step in (1, 3, 7, len(stream)):
        frames = w.Frames(1024)
        got = [f for at in range(0, len(stream), step) for f in frames.feed(stream[at : at + step])]
        assert got == FRAMES and frames.pending == 0


def test_a_frame_over_the_cap_is_refused_before_its_body():
    frames = w.Frames(100)
    with pytest.raises(FrameTooLarge):
        frames.feed((101).to_bytes(4, "big"))


@pytest.mark.parametrize("bad", [b"\x05\x01i", b"\x01\x01i\x01a\x02", b"\x03\x01i\x00", b""])
def test_a_malformed_frame_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError):
        w.decode_frame(bad)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickles_are_recognised(protocol):
    for value in ({"a": 1}, [1, 2], "text", None, b"x"):
        assert w.looks_pickled(pickle.dumps(value, protocol=protocol))


@pytest.mark.parametrize("data", [b"", b"x", b"\x08\x01\x12\x03abc", b"\x80", b"\x80\x04", b"\x80\x06abc."])
def test_other_bytes_are_not_pickles(data):
    assert not w.looks_pickled(data)


def test_relay_addresses_in_the_sdks_two_forms():
    addr = "/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit/p2p/12D3KooWMe"
    raw = w.encode_relay_addr(addr, "/lattica/1.0.0")
    assert raw[0] == len(addr) and raw.endswith(b"\x0e/lattica/1.0.0")
    assert w.decode_relay_addr(raw) == (addr, "/lattica/1.0.0")
    assert w.decode_relay_addr(addr.encode()) == (addr, None)  # (before 1.0.21)


@pytest.mark.parametrize("bad", [b"", b"\x05abc", b"\x01/\x01", b"\x01/\x01a\x00", b"/\xff\xfe"])
def test_a_malformed_relay_address_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError):
        w.decode_relay_addr(bad)


@pytest.mark.parametrize(
    "message",
    [
        w.Request("id-1", "Greeter.hello", bytes(300)),
        w.Request("i" * 4096, "M." + "m" * 4000, bytes(70_000), compression=3),
        w.Response("r", b"answer"),
        w.Failure("f", "an error" * 100),
    ],
)
def test_a_req_resp_messages_head_tells_its_size(message):
    """What a sender declares in a message's head (its data's or error's length) bounds the
    whole message: the deadline a request gets is set by it; an incomplete head says nothing."""
    raw = w.encode_message(message)
    known = next(n for n in range(1, len(raw) + 1) if w.message_size(raw[:n]) is not None)
    assert known < len(raw) and w.message_size(raw[:1]) is None
    for cut in (known, len(raw)):
        size = w.message_size(raw[:cut])
        assert size is not None and len(raw) <= size <= len(raw) + 18


def test_a_head_no_message_begins_with_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        w.message_size(b"\x07" + b"\x00" * 9000)
    with pytest.raises(ProtocolError):
        w.message_size(b"\x00" + b"\xfe" + (1 << 100).to_bytes(16, "little") + bytes(9000))
