"""The call protocol's sans-IO parts: frame splitting and message validation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica import _rpc as rpc
from lattica.errors import FrameTooLarge, ProtocolError


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=3000), min_size=1, max_size=10), st.lists(st.integers(1, 5000), min_size=1, max_size=20)
)
def test_any_split_yields_the_same_frames(msgs, cuts):
    wire = b"".join(len(m).to_bytes(4, "big") + m for m in msgs)
    sp = rpc.FrameSplitter(1 << 20)
    out, pos, i = [], 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        out += sp.feed(wire[pos : pos + step])
        pos += step
        i += 1
    assert [bytes(f) for f in out] == msgs


@pytest.mark.parametrize(
    "chunks", [[b"\x00\x01\x00\x00"], [b"\x00\x01", b"\x00\x00"], [b"\x00\x00\x00\x02ab\x00", b"\x01\x00\x00"]]
)
def test_oversized_declared_length_fails_fast(chunks):
    sp = rpc.FrameSplitter(1000)
    with pytest.raises(FrameTooLarge):
        for c in chunks:
            sp.feed(c)


def test_valid_messages_parse():
    assert rpc.parse(rpc.call(1, "a", "m", [1], {"k": 2}, 1.5, rpc.F_TELL))[0] == rpc.CALL
    assert rpc.parse([rpc.OK, 3, None]) == [rpc.OK, 3, None]
    assert rpc.parse([rpc.MAILBOX, "actor", 5])[2] == 5


@pytest.mark.parametrize(
    "msg",
    [
        None,
        [],
        "x",
        [99, 1],
        [rpc.CALL, 1, "a"],
        [rpc.CALL, -1, "a", "m", [], None, None, 0],
        [rpc.CALL, 1, 5, "m", [], None, None, 0],
        [rpc.CALL, 1, "a" * 300, "m", [], None, None, 0],
        [rpc.CALL, 1, "a", "m", "notalist", None, None, 0],
        [rpc.CALL, 1, "a", "m", [], {1: 2}, None, 0],
        [rpc.CALL, 1, "a", "m", [], None, -1, 0],
        [rpc.CALL, 1, "a", "m", [], None, float("nan"), 0],
        [rpc.CREDIT, 1, -5],
        [rpc.ERR, 1, "remote", 5, "m", ""],
        [rpc.ARG, 1, -1, None],
        [rpc.MAILBOX, 3, 1],
    ],
)
def test_malformed_messages_are_protocol_errors(msg):
    with pytest.raises(ProtocolError):
        rpc.parse(msg)


def test_a_call_message_has_named_fields_and_the_bytes_of_the_plain_list():
    import msgpack

    from lattica import codec

    msg = rpc.call(7, "actor", "method", [1, b"x"], {"k": 2}, 1.5, rpc.F_TELL)
    plain = [rpc.CALL, 7, "actor", "method", [1, b"x"], {"k": 2}, 1.5, rpc.F_TELL]
    assert (msg.cid, msg.actor, msg.method, msg.args, msg.kwargs, msg.timeout, msg.flags) == tuple(plain[1:])
    assert msgpack.packb(msg) == msgpack.packb(plain)
    assert codec.encode_bytes(msg) == codec.encode_bytes(plain)
    msg.timeout = 0.5
    assert msg == plain[:6] + [0.5, rpc.F_TELL] and rpc.parse(list(msg)) == msg
