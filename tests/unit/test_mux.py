"""The multiplexer as a pure state machine: two Mux objects wired back to back, no sockets."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica.errors import ConnectionClosed, ProtocolError, StreamClosed, StreamLimit
from lattica.transports.mux import (
    F_SYN,
    FRAME_HEADER,
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


def test_credit_with_a_reset_on_a_stream_with_pending_data_only_resets_it():
    """A WINDOW_UPDATE carrying credit and RST (a peer resetting one over-budget channel) ends
    that stream: no credit event for a stream that is gone (its pending data would be sent into
    a closed stream and the error would tear the whole connection down)."""
    c, s = pair()
    sid = c.open_stream()
    pump(c, s)
    events = c.receive_data(HDR.pack(0, T_WINDOW, 8, sid, 4096))  # (F_RST = 8, with 4 KiB of credit)
    assert of(events, StreamWasReset) and not of(events, WindowUpdated)
    assert c.num_streams == 0


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


def test_a_stream_that_crosses_our_goaway_on_the_wire_is_still_taken():
    """The drain: s says GOAWAY while c's SYN is on its way; s takes c's stream (refusing it would
    fail whatever c put on it), c answers with its own GOAWAY, and once both streams' ends are
    exchanged both sides are drained."""
    c, s = pair()
    sid = c.open_stream()
    c.send_data(sid, b"call")
    s.go_away()
    with pytest.raises(ConnectionClosed, match="going away"):
        s.open_stream()  # (we said we would open none)
    events = pump(c, s)  # c's SYN, sent before it heard s
    assert of(events, StreamOpened) and not of(events, StreamRefused)
    assert of(events, DataReceived)[0].data == b"call"
    assert of(pump(s, c), GoAwayReceived) and c.remote_goaway
    with pytest.raises(ConnectionClosed, match="going away"):
        c.open_stream()
    c.go_away()
    pump(c, s)
    assert not s.drained and not c.drained  # the stream is still open on both sides
    c.close_stream(sid)
    s.close_stream(sid)
    pump(c, s)
    pump(s, c)
    s.consumed(sid, 4)
    assert s.drained and c.drained


def test_a_stream_opened_after_the_peers_goaway_is_refused():
    c, s = pair()
    c.go_away()
    assert of(pump(c, s), GoAwayReceived)
    # c promised to open no more; a SYN that comes anyway is refused, not taken
    events = s.receive_data(HDR.pack(0, T_WINDOW, F_SYN, 1, 0))
    assert of(events, StreamRefused) and not of(events, StreamOpened)


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


MiB = 1 << 20


def _round(c: Mux, s: Mux, sid: int, t: float, read: int | None = None) -> int:
    """One round trip of a sender that always has data: it fills the credit it holds; the reader
    reads ``read`` bytes (default: everything) at ``t``, in 256 KiB reads; credit flows back."""
    c.send_data(sid, bytes(c.send_window(sid)))
    got = sum(len(e.data) for e in of(pump(c, s), DataReceived))
    left = got if read is None else min(read, got)
    while left > 0:
        n = min(PROTOCOL_WINDOW, left)
        s.consumed(sid, n, t)
        left -= n
    pump(s, c)
    return got


def _stream(**cfg):
    c, s = pair(**cfg)
    sid = c.open_stream()
    pump(c, s)
    pump(s, c)
    return c, s, sid


def test_a_window_limited_stream_grows_its_window_up_to_the_bound():
    c, s, sid = _stream(window=MiB, max_window=8 * MiB)
    s.rtt = 0.1  # a long link: a window per round trip is all the peer may send
    sent = [_round(c, s, sid, 1.0 + 0.1 * i) for i in range(8)]
    assert sent[0] == MiB and sent[-1] == 8 * MiB and sorted(sent) == sent
    assert s._streams[sid].target == 8 * MiB and c.send_window(sid) == 8 * MiB


def test_without_a_round_trip_or_a_clock_the_window_stays():
    c, s, sid = _stream(window=MiB, max_window=8 * MiB)
    assert [_round(c, s, sid, 1.0 + 0.1 * i) for i in range(4)] == [MiB] * 4  # rtt unknown
    s.rtt = 0.1
    assert [_round(c, s, sid, 0.0) for i in range(4)] == [MiB] * 4  # no clock given


def test_a_stream_that_slows_down_shrinks_back_but_not_below_the_first_window():
    c, s, sid = _stream(window=MiB, max_window=8 * MiB)
    s.rtt = 0.1
    for i in range(6):
        _round(c, s, sid, 1.0 + 0.1 * i)
    assert s._streams[sid].target == 8 * MiB
    # now the reader reads 256 KiB every 0.25 s (2.5 round trips): the window halves each time a
    # quarter of it took over four round trips to read
    targets = []
    t = 10.0
    for _ in range(6):
        c.send_data(sid, bytes(c.send_window(sid)))
        pump(c, s)
        while s._streams[sid].buffered:
            s.consumed(sid, min(PROTOCOL_WINDOW, s._streams[sid].buffered), t)
            t += 0.25
        pump(s, c)
        targets.append(s._streams[sid].target)
    assert targets[0] < 8 * MiB and targets[-1] == MiB and targets == sorted(targets, reverse=True)
    # and the credit the peer holds has come down with it
    assert c.send_window(sid) == MiB


def test_growth_stays_within_the_connection_budget():
    c, s, sid = _stream(window=MiB, max_window=64 * MiB, max_buffered=6 * MiB)
    s.rtt = 0.1
    for i in range(10):
        _round(c, s, sid, 1.0 + 0.1 * i)
    assert s._committed <= 6 * MiB and c.send_window(sid) <= 6 * MiB
    assert s._streams[sid].target >= 4 * MiB  # it grew as far as the budget let it


def test_a_window_grows_at_most_twofold_a_round_trip():
    c, s, sid = _stream(window=MiB, max_window=64 * MiB)
    s.rtt = 0.1
    sent = [_round(c, s, sid, 1.0 + 0.1 * i + 1e-6 * i) for i in range(5)]  # (rounds a hair over an RTT apart)
    assert sent == [MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB]


def test_below_a_millisecond_of_round_trip_nothing_is_tuned():
    c, s, sid = _stream(window=MiB, max_window=8 * MiB)
    s.rtt = 0.0005  # a LAN: the configured window already carries gigabytes per second
    assert [_round(c, s, sid, 1.0 + 0.001 * i) for i in range(4)] == [MiB] * 4


def test_a_frame_in_flight_on_a_stream_we_reset_never_breaks_the_connection():
    # the peer may hold up to max_window of credit on a stream; after we reset it, its frames (up
    # to the peer's max_frame) still arrive and are dropped, not taken for a protocol violation
    c, s, sid = _stream(window=PROTOCOL_WINDOW, max_window=16 * MiB)
    s.rtt = 0.01
    for i in range(8):  # the peer fills its credit each round trip; we read it in 64 KiB reads
        got = sum(
            len(e.data) for e in of(pump(c, s) if c.send_data(sid, bytes(c.send_window(sid))) else [], DataReceived)
        )
        for _ in range(got // (64 << 10)):
            s.consumed(sid, 64 << 10, 1.0 + 0.011 * i)
        pump(s, c)
    assert c.send_window(sid) > MiB
    c.send_data(sid, bytes(c.send_window(sid)))
    s.reset_stream(sid)
    assert not of(pump(c, s), DataReceived)  # dropped, and no ProtocolError
    sid2 = c.open_stream()
    c.send_data(sid2, b"still here")
    assert of(pump(c, s), DataReceived)[0].data == b"still here"


def test_a_stream_opened_while_the_budget_is_spent_gets_its_window_once_it_frees():
    c, s = pair(window=4 * MiB, max_buffered=8 * MiB)
    hogs = [c.open_stream() for _ in range(2)]
    pump(c, s)
    pump(s, c)
    for h in hogs:
        c.send_data(h, bytes(c.send_window(h)))
    pump(c, s)  # 8 MiB sits unread at s: its budget is spent
    late = c.open_stream()
    pump(c, s)
    pump(s, c)
    assert c.send_window(late) == PROTOCOL_WINDOW  # only the minimum for now
    for h in hogs:  # the hogs are read and closed: the budget frees up
        s.consumed(h, s._streams[h].buffered)
        c.reset_stream(h)
    pump(c, s)
    pump(s, c)
    moved = 0
    for _ in range(4):  # the late stream's credit keeps flowing, and grows to the configured window
        n = c.send_data(late, bytes(c.send_window(late)))
        pump(c, s)
        s.consumed(late, n)
        pump(s, c)
        moved += n
    assert moved > 4 * PROTOCOL_WINDOW and c.send_window(late) == 4 * MiB


def test_opens_beyond_the_credit_are_held_unparsed_until_granted():
    """A peer may open only as many streams as granted: at the next SYN parsing stops, and
    everything after it (other streams' data included) waits, in order, until more credit."""
    a, b = pair()
    b.open_credit = 2
    sids = [a.open_stream() for _ in range(5)]
    for sid in sids:
        a.send_data(sid, b"x%d" % sid)
    ev = pump(a, b)
    assert [e.stream_id for e in of(ev, StreamOpened)] == sids[:2] and b.held
    assert b.open_credit == 0
    assert b.receive_data(b"") == [] and b.held, "no credit: still held"
    a.send_data(sids[0], b"later")
    assert pump(a, b) == [], "bytes arriving while held wait behind the held SYN"
    b.grant_opens(2)
    ev = b.receive_data(b"")
    assert [e.stream_id for e in of(ev, StreamOpened)] == sids[2:4] and b.held
    b.grant_opens(10)
    ev = b.receive_data(b"")
    assert [e.stream_id for e in of(ev, StreamOpened)] == sids[4:] and not b.held
    got = {}
    for e in of(ev, DataReceived):
        got[e.stream_id] = got.get(e.stream_id, b"") + e.data
    want = {sid: b"x%d" % sid for sid in sids}
    want[sids[0]] += b"later"
    assert got == want, "the data held behind the SYNs came in order, nothing lost"
    assert b.open_credit == 9


def test_without_credit_metering_opens_are_not_counted():
    a, b = pair()
    for _ in range(50):
        a.open_stream()
    assert len(of(pump(a, b), StreamOpened)) == 50 and not b.held and b.open_credit is None


def test_syns_after_the_peers_goaway_are_refused_without_credit():
    a, b = pair()
    b.open_credit = 0
    a.go_away()
    assert of(pump(a, b), GoAwayReceived)
    syns = b"".join(HDR.pack(0, T_WINDOW, F_SYN, 2 * i + 1001, 0) for i in range(10))
    ev = b.receive_data(syns)
    assert len(of(ev, StreamRefused)) == 10 and not b.held


def test_streams_an_untrusted_peer_opens_get_the_minimum_window_until_it_is_trusted():
    """Not ``generous``: a stream the peer opens gets yamux's 256 KiB, no more (it may leave it
    unread); ours get the full window. Once generous, the peer's streams grow to it as read."""
    a, b = pair(window=4 * PROTOCOL_WINDOW)
    b.generous = False
    sid = a.open_stream()
    pump(a, b)
    pump(b, a)
    assert a.send_window(sid) == PROTOCOL_WINDOW, "the peer's stream: the protocol's minimum"
    mine = b.open_stream()
    pump(b, a)
    pump(a, b)
    assert a.send_window(mine) == 4 * PROTOCOL_WINDOW, "ours: the full window"
    a.send_data(sid, b"x" * PROTOCOL_WINDOW)
    pump(a, b)
    b.consumed(sid, PROTOCOL_WINDOW)
    pump(b, a)
    assert a.send_window(sid) == PROTOCOL_WINDOW, "read: credit comes back, the window stays"
    b.generous = True
    a.send_data(sid, b"x" * PROTOCOL_WINDOW)
    pump(a, b)
    b.consumed(sid, PROTOCOL_WINDOW)
    pump(b, a)
    assert a.send_window(sid) == 4 * PROTOCOL_WINDOW, "trusted: topped up to the full window"
