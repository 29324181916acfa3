"""The multiplexer as a pure state machine: two Mux objects wired back to back, no sockets."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from lattica.errors import ConnectionClosed, ProtocolError, StreamClosed, StreamLimit
from lattica.transports.mux import (
    FRAME_HEADER,
    F_SYN,
    PROTOCOL_WINDOW,
    T_DATA,
    T_WINDOW,
    DataReceived,
    GoAwayReceived,
    Mux,
    MuxConfig,
    PongReceived,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamWasReset,
    WindowUpdated,
)

HDR = FRAME_HEADER


def pump(src: Mux, dst: Mux) -> list:
    return dst.receive_data(bytes(src.data_to_send()))


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def pair(**cfg):
    return Mux(True, MuxConfig(**cfg)), Mux(False, MuxConfig(**cfg))


def test_open_send_close_both_ways():
    c, s = pair()
    sid = c.open_stream()
    assert sid % 2 == 1
    assert c.send_data(sid, b"hello") == 5
    c.close_stream(sid)
    ev = pump(c, s)
    assert of(ev, StreamOpened)[0].stream_id == sid
    assert b"".join(e.data for e in of(ev, DataReceived)) == b"hello"
    assert of(ev, StreamEnded)
    assert of(pump(s, c), WindowUpdated)  # the ACK
    s.send_data(sid, b"back")
    s.close_stream(sid)
    ev = pump(s, c)
    assert of(ev, DataReceived)[0].data == b"back" and of(ev, StreamEnded)
    c.consumed(sid, 4)
    s.consumed(sid, 5)
    assert c.num_streams == 0 and s.num_streams == 0


def test_window_is_credit_and_consumption_returns_it():
    c, s = pair(window=PROTOCOL_WINDOW)
    sid = c.open_stream()
    big = os.urandom(PROTOCOL_WINDOW * 3)
    sent = c.send_data(sid, big)
    assert sent == PROTOCOL_WINDOW  # no more than the peer granted
    assert c.send_data(sid, big[sent:]) == 0
    ev = pump(c, s)
    got = sum(len(e.data) for e in of(ev, DataReceived))
    assert got == PROTOCOL_WINDOW
    pump(s, c)
    assert c.send_window(sid) == 0
    s.consumed(sid, got)  # the application read it: credit flows back
    assert of(pump(s, c), WindowUpdated)
    assert c.send_window(sid) == PROTOCOL_WINDOW


def test_larger_window_is_granted_at_open():
    c, s = pair(window=4 * PROTOCOL_WINDOW)
    sid = c.open_stream()
    pump(c, s)
    pump(s, c)
    assert c.send_window(sid) == 4 * PROTOCOL_WINDOW
    assert s.send_window(sid) == 4 * PROTOCOL_WINDOW


def test_overrunning_the_window_is_a_protocol_error():
    c, s = pair(window=PROTOCOL_WINDOW)
    sid = c.open_stream()
    pump(c, s)
    frame = HDR.pack(0, T_DATA, 0, sid, PROTOCOL_WINDOW + 1) + bytes(PROTOCOL_WINDOW + 1)
    with pytest.raises(ProtocolError, match="overran"):
        s.receive_data(frame)


def test_reset_reaches_peer_and_late_data_is_dropped():
    c, s = pair()
    sid = c.open_stream()
    c.send_data(sid, b"x")
    pump(c, s)
    s.reset_stream(sid)
    assert of(pump(s, c), StreamWasReset)
    assert s.num_streams == 0 and c.num_streams == 0
    # data already in flight for the reset stream is ignored, not an error
    assert s.receive_data(HDR.pack(0, T_DATA, 0, sid, 3) + b"abc") == []


def test_stream_limit_local_and_remote():
    c, s = pair(max_streams=2)
    c.open_stream(), c.open_stream()
    with pytest.raises(StreamLimit):
        c.open_stream()
    # a peer ignoring our limit gets its extra stream refused with RST, the connection survives
    ev = s.receive_data(bytes(c.data_to_send()) + HDR.pack(0, T_WINDOW, F_SYN, 5, 0))
    assert len(of(ev, StreamOpened)) == 2
    assert of(ev, StreamRefused)[0].stream_id == 5


def test_total_credit_is_capped_across_streams():
    """256 streams at a 4 MiB window would promise 1 GiB; the budget keeps the total near
    max_buffered (each stream still gets yamux's 256 KiB minimum)."""
    c, s = Mux(True), Mux(False, MuxConfig(max_buffered=16 * 2**20))
    sids = [c.open_stream() for _ in range(256)]
    pump(c, s)
    pump(s, c)
    granted = sum(c.send_window(sid) for sid in sids)
    assert granted <= 16 * 2**20 + 256 * PROTOCOL_WINDOW
    assert min(c.send_window(sid) for sid in sids) >= PROTOCOL_WINDOW
    # fill every window: what the server buffers is bounded by the same figure
    for sid in sids:
        c.send_data(sid, bytes(c.send_window(sid)))
    pump(c, s)
    assert s._buffered_total == granted


def test_peer_streams_cannot_starve_our_own():
    c, s = pair(max_streams=4)
    for _ in range(4):
        c.open_stream()
    pump(c, s)
    assert s.open_stream() % 2 == 0  # the server can still open its own streams


@pytest.mark.parametrize(
    "frame, match",
    [
        (HDR.pack(1, T_DATA, 0, 1, 0), "version"),
        (HDR.pack(0, 9, 0, 1, 0), "type"),
        (HDR.pack(0, T_WINDOW, F_SYN, 2, 0), "not its id"),  # client-parity id from the client side
    ],
)
def test_malformed_frames(frame, match):
    s = Mux(False)
    with pytest.raises(ProtocolError, match=match):
        s.receive_data(frame)


def test_duplicate_syn_is_a_protocol_error():
    s = Mux(False)
    s.receive_data(HDR.pack(0, T_WINDOW, F_SYN, 1, 0))
    with pytest.raises(ProtocolError):
        s.receive_data(HDR.pack(0, T_WINDOW, F_SYN, 1, 0))


def test_huge_declared_data_frame_fails_fast():
    s = Mux(False)
    with pytest.raises(ProtocolError, match="overran"):
        s.receive_data(HDR.pack(0, T_DATA, F_SYN, 1, 2**31))
    with pytest.raises(ProtocolError, match="exceeds any window"):
        Mux(False).receive_data(HDR.pack(0, T_DATA, 0, 7, 2**31))  # on a stream that is not open


def test_data_frame_split_across_reads_is_delivered_as_it_arrives():
    c, s = pair()
    sid = c.open_stream()
    pump(c, s)
    payload = bytes(range(256)) * 40
    c.send_data(sid, payload)
    c.close_stream(sid)
    wire = bytes(c.data_to_send())
    got, ended = bytearray(), []
    for i in range(0, len(wire), 7):  # splits headers and payload alike
        for ev in s.receive_data(wire[i : i + 7]):
            if isinstance(ev, DataReceived):
                assert not ended, "data after the FIN event"
                got += ev.data
            elif isinstance(ev, StreamEnded):
                ended.append(ev)
    assert bytes(got) == payload and len(ended) == 1


def test_reset_in_the_middle_of_a_data_frame_drops_the_rest():
    c, s = pair()
    sid = c.open_stream()
    pump(c, s)
    c.send_data(sid, bytes(1000))
    c.send_data(c.open_stream(), b"after")
    wire = bytes(c.data_to_send())
    first = s.receive_data(wire[:500])
    assert sum(len(e.data) for e in first if isinstance(e, DataReceived)) == 500 - HDR.size
    s.reset_stream(sid)
    rest = s.receive_data(wire[500:])
    assert [e.data for e in rest if isinstance(e, DataReceived)] == [b"after"]


def test_write_after_fin_and_data_after_fin():
    c, s = pair()
    sid = c.open_stream()
    c.close_stream(sid)
    with pytest.raises(StreamClosed):
        c.send_data(sid, b"late")
    pump(c, s)
    with pytest.raises(ProtocolError, match="after its FIN"):
        s.receive_data(HDR.pack(0, T_DATA, 0, sid, 1) + b"z")


def test_ping_and_go_away():
    c, s = pair()
    c.ping(42)
    pump(c, s)  # s answers automatically
    assert of(pump(s, c), PongReceived)[0].opaque == 42
    s.go_away()
    assert of(pump(s, c), GoAwayReceived)
    with pytest.raises(ConnectionClosed, match="going away"):
        c.open_stream()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=5000), min_size=1, max_size=20), st.integers(1, 997))
def test_any_split_of_the_byte_stream_delivers_the_same_data(chunks, cut):
    c, s = pair()
    sid = c.open_stream()
    for ch in chunks:
        assert c.send_data(sid, ch) == len(ch)
    c.close_stream(sid)
    wire = bytes(c.data_to_send())
    events = []
    for i in range(0, len(wire), cut):
        events += s.receive_data(wire[i : i + cut])
    assert b"".join(e.data for e in of(events, DataReceived)) == b"".join(chunks)
    assert of(events, StreamEnded)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_raises_only_protocol_error(data):
    s = Mux(False)
    try:
        s.receive_data(data)
    except ProtocolError:
        pass
