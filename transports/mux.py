"""Stream multiplexer (sans-IO), speaking yamux's wire format.

Many streams share one secure byte stream. Each stream has a credit window per direction: a sender
may only have as many unacknowledged bytes in flight as the receiver granted, and the receiver grants
more only as its application consumes data — so a slow reader pushes back on its writer and memory
stays bounded. Frames: 12-byte header (version, type, flags, stream id, length) then payload.

Feed received plaintext to :meth:`Mux.receive_data`, which returns events; call the command methods
(:meth:`open_stream`, :meth:`send_data`, :meth:`consumed`, ...) and write out
:meth:`Mux.data_to_send`. Nothing here touches a socket or a clock.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lattica.errors import ConnectionClosed, ProtocolError, StreamClosed, StreamLimit, StreamReset

__all__ = [
    "Mux",
    "MuxConfig",
    "StreamOpened",
    "DataReceived",
    "StreamEnded",
    "StreamWasReset",
    "WindowUpdated",
    "StreamRefused",
    "PongReceived",
    "GoAwayReceived",
]

FRAME_HEADER = _HDR = struct.Struct(">BBHII")  # version, type, flags, stream id, length
HEADER_LEN = _HDR.size
_VERSION = 0
T_DATA, T_WINDOW, T_PING, T_GOAWAY = 0, 1, 2, 3
F_SYN, F_ACK, F_FIN, F_RST = 1, 2, 4, 8
GOAWAY_NORMAL, GOAWAY_PROTOCOL, GOAWAY_INTERNAL = 0, 1, 2
PROTOCOL_WINDOW = 256 * 1024  # yamux's initial window; every stream starts with it
_BY_REFERENCE = 16 * 1024  # payloads this large are queued as views, smaller ones copied
MAX_OPENS_AFTER_GOAWAY = 64  # SYNs after the peer's own GOAWAY refused before it counts as a protocol error
_TUNE_MIN_RTT = 0.001  # s: below this, ``window`` already covers gigabytes per second: no tuning


@dataclass(frozen=True)
class MuxConfig:
    max_streams: int = 256  # open streams per direction: the peer's opens cannot starve ours
    window: int = 4 * 1024 * 1024  # per-stream receive window we grant at first (>= 256 KiB)
    # A stream whose peer sends a whole window per round trip is held back by it: its window
    # doubles (at most once a round trip), up to this, while the reader keeps up, and comes back
    # towards ``window`` once the stream slows down; the round trip comes from the glue
    # (``Mux.rtt``; below 1 ms nothing is tuned). <= ``window``: never grows.
    max_window: int = 16 * 1024 * 1024
    max_frame: int = 1024 * 1024  # largest data frame we send
    # Cap on credit promised plus data unread, across all streams. Every stream may always hold
    # yamux's 256 KiB minimum; only credit beyond it is rationed by this budget.
    max_buffered: int = 64 * 1024 * 1024


# -- events -----------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamOpened:
    stream_id: int


@dataclass(slots=True)
class DataReceived:
    stream_id: int
    data: bytes


@dataclass(slots=True)
class StreamEnded:
    """The peer half-closed the stream (FIN): no more data will arrive."""

    stream_id: int


@dataclass(slots=True)
class StreamWasReset:
    stream_id: int


@dataclass(slots=True)
class WindowUpdated:
    """The peer granted credit (or acknowledged our SYN); queued data may now be sent."""

    stream_id: int


@dataclass(slots=True)
class StreamRefused:
    """An inbound stream was refused (over the stream limit or the buffer budget) and reset."""

    stream_id: int
    reason: str


@dataclass(slots=True)
class PongReceived:
    opaque: int


@dataclass(slots=True)
class GoAwayReceived:
    code: int


class _StreamState:
    __slots__ = (
        "send_window",
        "recv_window",
        "unacked",
        "buffered",
        "local_fin",
        "remote_fin",
        "target",
        "epoch",
        "grown",
    )

    def __init__(self, target: int) -> None:
        self.send_window = PROTOCOL_WINDOW
        self.recv_window = PROTOCOL_WINDOW  # credit the peer still has on this stream
        self.unacked = 0  # consumed bytes not yet returned to the peer as credit
        self.buffered = 0  # received, not yet consumed by the application
        self.local_fin = False
        self.remote_fin = False
        self.target = target  # the window this stream is tuned to (config.window .. max_window)
        self.epoch = 0.0  # when its credit was last returned (0: not yet)
        self.grown = float("-inf")  # when its window last grew


class Mux:
    """One side of a multiplexed connection."""

    def __init__(self, is_client: bool, config: MuxConfig | None = None) -> None:
        self.config = config or MuxConfig()
        if self.config.window < PROTOCOL_WINDOW:
            raise ValueError("mux window must be at least 256 KiB")
        if not 0 <= self.config.max_window < 2**32:
            raise ValueError("mux max_window must be within 0 .. 2**32 - 1")
        self._largest = max(self.config.window, self.config.max_window)  # the most credit a stream may hold
        self.rtt = 0.0  # the path's round trip in seconds, kept current by the glue (0: unknown, no tuning)
        self._next_id = 1 if is_client else 2
        self._peer_parity = 0 if is_client else 1
        self._streams: dict[int, _StreamState] = {}
        self._n_local = 0  # open streams we initiated
        self._n_remote = 0  # open streams the peer initiated
        self._out: list = []  # queued for the wire: small frames coalesced, large payloads by reference
        self._tail = bytearray()  # the last small piece, still growing
        self._in = bytearray()  # a partial frame header
        self._frame_left = 0  # payload bytes of the current data frame still to arrive
        self._frame_sid = 0
        self._frame_flags = 0
        self._buffered_total = 0  # received, not yet consumed (all streams)
        self._committed = 0  # credit held by the peer + bytes buffered (all streams)
        self.local_goaway = False
        self.remote_goaway = False
        self.answered = 0  # bytes of frames queued only to answer the peer (pongs, refusals); the glue resets it
        # Streams the peer may still open (None: any number). At 0, parsing stops at the next
        # SYN and what follows is kept unparsed (``held``) until ``grant_opens``: a peer that
        # opens faster than its budget waits, with its bytes unread, instead of costing work.
        # (SYNs after the peer's GOAWAY are refused at once and need no credit: past
        # MAX_OPENS_AFTER_GOAWAY of them the connection is closed for breaking the protocol.)
        self.open_credit: int | None = None
        self.held = False
        self._after_goaway = 0  # SYNs the peer sent after its GOAWAY (refused; past a few, a violation)
        # Streams the peer opens get more than yamux's 256 KiB window (``window``, tuned up to
        # ``max_window``) only while this is True: off, a peer not yet trusted pins at most the
        # protocol's minimum of our memory per stream it opens and leaves unread. The streams we
        # open always get the full window (we ask for what they carry).
        self.generous = True

    # -- commands ----------------------------------------------------------------------------------

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def open_stream(self) -> int:
        """Allocate a stream id and queue its SYN (which also raises the peer's credit)."""
        if self.local_goaway or self.remote_goaway:
            raise ConnectionClosed("connection is going away; no new streams")
        if self._n_local >= self.config.max_streams:
            raise StreamLimit(f"stream limit of {self.config.max_streams} reached on this connection")
        sid = self._next_id
        if sid >= 2**32 - 2:
            raise StreamLimit("stream ids exhausted on this connection")
        self._next_id += 2
        st = self._add(sid, local=True)
        self._frame(T_WINDOW, F_SYN, sid, self._initial_grant(st, self.config.window))
        return sid

    def _add(self, sid: int, local: bool) -> _StreamState:
        st = _StreamState(self.config.window)
        self._streams[sid] = st
        self._committed += st.recv_window
        if local:
            self._n_local += 1
        else:
            self._n_remote += 1
        return st

    @property
    def remote_streams(self) -> int:
        """Streams the peer opened, open now."""
        return self._n_remote

    def _remove(self, sid: int) -> _StreamState | None:
        st = self._streams.pop(sid, None)
        if st is not None:
            self._buffered_total -= st.buffered
            self._committed -= st.recv_window + st.buffered
            if sid % 2 == self._peer_parity:
                self._n_remote -= 1
            else:
                self._n_local -= 1
        return st

    def _budget(self) -> int:
        return max(0, self.config.max_buffered - self._committed)

    def _windows(self, sid: int) -> tuple[int, int]:
        """The window and the largest tuned window of stream ``sid`` now (see ``generous``)."""
        if self.generous or sid % 2 != self._peer_parity:
            return self.config.window, self.config.max_window
        return PROTOCOL_WINDOW, PROTOCOL_WINDOW

    def _initial_grant(self, st: _StreamState, window: int) -> int:
        extra = min(window - PROTOCOL_WINDOW, self._budget())
        st.recv_window += extra
        st.target = PROTOCOL_WINDOW + extra  # (short of ``window`` when the budget is spent: topped up later)
        self._committed += extra
        return extra

    def send_window(self, stream_id: int) -> int:
        st = self._streams.get(stream_id)
        return st.send_window if st is not None else 0

    def send_data(self, stream_id: int, data: bytes | bytearray | memoryview) -> int:
        """Queue as much of ``data`` as the peer's credit allows; return how many bytes were taken."""
        st = self._streams.get(stream_id)
        if st is None:
            raise StreamReset(f"stream {stream_id} is not open")
        if st.local_fin:
            raise StreamClosed(f"stream {stream_id} was already closed for writing")
        n = min(len(data), st.send_window)
        if n <= 0:
            return 0
        st.send_window -= n
        view = data if type(data) is memoryview else memoryview(data)
        tail = self._tail
        step = self.config.max_frame
        for i in range(0, n, step):
            m = min(step, n - i)
            tail += _HDR.pack(_VERSION, T_DATA, 0, stream_id, m)
            if m < _BY_REFERENCE:
                tail += view[i : i + m]
            else:
                self._out.append(tail)
                self._out.append(view[i : i + m])
                tail = self._tail = bytearray()
        return n

    def close_stream(self, stream_id: int) -> None:
        """Half-close our side (FIN). Reading continues until the peer closes too."""
        st = self._streams.get(stream_id)
        if st is None or st.local_fin:
            return
        st.local_fin = True
        self._frame(T_WINDOW, F_FIN, stream_id, 0)
        self._maybe_forget(stream_id, st)

    def reset_stream(self, stream_id: int) -> None:
        if self._remove(stream_id) is not None:
            self._frame(T_WINDOW, F_RST, stream_id, 0)

    def consumed(self, stream_id: int, n: int, now: float = 0.0) -> None:
        """The application read ``n`` bytes of the stream at ``now`` (seconds, any clock; 0: no
        clock): return credit to the peer in batches, and tune the stream's window (see
        ``MuxConfig.max_window``)."""
        st = self._streams.get(stream_id)
        if st is None:
            return
        st.buffered -= n
        self._buffered_total -= n
        self._committed -= n
        st.unacked += n
        if st.remote_fin:
            self._maybe_forget(stream_id, st)
            return
        if st.unacked >= st.target // 4:
            # return what was read, within the budget -- but never leave a stream below the minimum
            budget = self._budget()
            grant = returned = min(st.unacked, max(budget, PROTOCOL_WINDOW - st.recv_window))
            window, max_window = self._windows(stream_id)
            if st.target < window:  # a stream opened while the budget was spent (or before its peer was trusted)
                top = max(0, min(window - st.target, budget - grant))
                st.target += top
                grant += top
            elif self.rtt >= _TUNE_MIN_RTT and now > 0.0:
                grant += self._tune(st, now, budget - grant, returned, window, max_window)
            st.unacked -= returned
            if grant <= 0:
                return
            st.epoch = now
            st.recv_window += grant
            self._committed += grant
            self._frame(T_WINDOW, 0, stream_id, grant)

    def _tune(self, st: _StreamState, now: float, spare: int, returning: int, window: int, max_window: int) -> int:
        """Credit to add (or, negative, to keep back of the ``returning`` bytes) as the stream's
        window changes. A quarter window read in under half a round trip since the last return
        means the peer sends a window per round trip and is held back by it: double (at most once
        a round trip, within the budget's ``spare``). One that took over four round trips means
        the window is far larger than the stream needs: keep back up to the bytes returning now
        (not below ``window``)."""
        elapsed = now - st.epoch
        if st.epoch <= 0.0 or elapsed < 0.0:  # (no earlier return; or a clock that went back)
            return 0
        if elapsed < 0.5 * self.rtt:
            if now - st.grown < self.rtt:
                return 0
            grow = min(st.target, max_window - st.target, spare)
            if grow > 0:
                st.target += grow
                st.grown = now
                return grow
        elif elapsed > 4.0 * self.rtt and st.target > window:
            cut = min(st.target // 2, st.target - window, returning)
            st.target -= cut
            return -cut
        return 0

    def ping(self, opaque: int) -> None:
        self._frame(T_PING, F_SYN, 0, opaque & 0xFFFFFFFF)

    def go_away(self, code: int = GOAWAY_NORMAL) -> None:
        """Say we open no more streams (GOAWAY). With ``GOAWAY_NORMAL`` it starts a drain: the
        peer stops opening streams too (and says so), streams open on either side go on, and the
        peer's streams that cross our GOAWAY on the wire are still taken; other codes precede a
        teardown."""
        if not self.local_goaway:
            self.local_goaway = True
            self._frame(T_GOAWAY, 0, 0, code)

    @property
    def drained(self) -> bool:
        """Both sides said GOAWAY and no stream is left: nothing more can happen here."""
        return self.local_goaway and self.remote_goaway and not self._streams

    def data_to_send(self) -> bytearray:
        """Everything queued for the wire since the last call (possibly empty), in one buffer."""
        return bytearray().join(self.pieces_to_send())

    def pieces_to_send(self) -> list:
        """Everything queued for the wire since the last call, as a list of buffers to write in order.

        Large payloads are views of the buffers given to :meth:`send_data` (not copies), so those
        must not be modified until written.
        """
        out = self._out
        if self._tail:
            out.append(self._tail)
            self._tail = bytearray()
        self._out = []
        return out

    def has_data_to_send(self) -> bool:
        return bool(self._out) or bool(self._tail)

    @property
    def held_bytes(self) -> int:
        """Bytes received and kept unparsed (behind a held SYN, or a partial header)."""
        return len(self._in)

    def grant_opens(self, n: int) -> None:
        """Let the peer open ``n`` more streams; a held parse goes on at the next ``receive_data``
        (``b""`` will do)."""
        if self.open_credit is not None:
            self.open_credit += n

    # -- input --------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list:
        """Parse received bytes; return events. Raises ProtocolError on a protocol violation.

        Data frames are delivered as their bytes arrive (a frame split across reads yields several
        DataReceived events), so nothing but a partial 12-byte header is ever held back here.
        """
        events: list = []
        if self._in:
            self._in += data
            if self.held and self.open_credit is not None and self.open_credit <= 0:
                return events
            data, self._in = self._in, bytearray()
        self.held = False
        mv = memoryview(data)
        total = len(mv)
        pos = 0
        unpack = _HDR.unpack_from
        try:
            while pos < total:
                if self._frame_left:
                    pos = self._data_part(events, mv, pos, total)
                    continue
                if total - pos < HEADER_LEN:
                    self._in += mv[pos:]
                    break
                version, ftype, flags, sid, length = unpack(mv, pos)
                if flags & F_SYN and ftype <= T_WINDOW and self.open_credit is not None and not self.remote_goaway:
                    if self.open_credit <= 0:
                        self.held = True
                        self._in += mv[pos:]
                        break
                    self.open_credit -= 1
                pos += HEADER_LEN
                if version != _VERSION:
                    raise ProtocolError(f"mux frame with unknown version {version}")
                if ftype == T_DATA:
                    self._data_start(events, flags, sid, length)
                elif ftype == T_WINDOW:
                    self._on_window(events, flags, sid, length)
                elif ftype == T_PING:
                    if flags & F_SYN:
                        self._frame(T_PING, F_ACK, 0, length)
                        self.answered += HEADER_LEN
                    elif flags & F_ACK:
                        events.append(PongReceived(length))
                elif ftype == T_GOAWAY:
                    self.remote_goaway = True
                    events.append(GoAwayReceived(length))
                else:
                    raise ProtocolError(f"mux frame with unknown type {ftype}")
        finally:
            mv.release()
        return events

    def _data_start(self, events: list, flags: int, sid: int, length: int) -> None:
        """A data frame header: open the stream on SYN, check the length against the credit."""
        st = self._stream_for(events, flags, sid)
        if st is None:
            if length > self._largest:
                raise ProtocolError(f"mux data frame of {length} bytes exceeds any window")
        elif length:
            if st.remote_fin:
                raise ProtocolError(f"data on stream {sid} after its FIN")
            if length > st.recv_window:
                raise ProtocolError(f"peer overran the window of stream {sid} ({length} > {st.recv_window})")
        self._frame_left = length
        self._frame_sid = sid
        self._frame_flags = flags
        if not length:
            self._data_end(events)

    def _data_part(self, events: list, mv: memoryview, pos: int, total: int) -> int:
        """Deliver what has arrived of the current data frame; return the new position."""
        n = min(self._frame_left, total - pos)
        self._frame_left -= n
        sid = self._frame_sid
        st = self._streams.get(sid)
        if st is not None:  # else reset or refused meanwhile: the bytes are dropped
            st.recv_window -= n
            st.buffered += n
            self._buffered_total += n
            events.append(DataReceived(sid, bytes(mv[pos : pos + n])))
        if not self._frame_left:
            self._data_end(events)
        return pos + n

    def _data_end(self, events: list) -> None:
        st = self._streams.get(self._frame_sid)
        if st is not None:
            self._on_flags(events, self._frame_flags, self._frame_sid, st)

    def _stream_for(self, events: list, flags: int, sid: int) -> _StreamState | None:
        st = self._streams.get(sid)
        if flags & F_SYN:
            if st is not None or sid == 0 or sid % 2 != self._peer_parity:
                raise ProtocolError(f"peer opened stream {sid}, which is in use or not its id")
            if self.remote_goaway:  # (it said it would open no more: streams sent before that are taken)
                self._after_goaway += 1
                if self._after_goaway > MAX_OPENS_AFTER_GOAWAY:
                    raise ProtocolError(f"the peer opened over {MAX_OPENS_AFTER_GOAWAY} streams after its GOAWAY")
                self._frame(T_WINDOW, F_RST, sid, 0)
                self.answered += HEADER_LEN
                events.append(StreamRefused(sid, "the peer opened a stream after its GOAWAY"))
                return None
            if self._n_remote >= self.config.max_streams:
                self._frame(T_WINDOW, F_RST, sid, 0)
                self.answered += HEADER_LEN
                events.append(StreamRefused(sid, f"stream limit {self.config.max_streams} reached"))
                return None
            st = self._add(sid, local=False)
            self._frame(T_WINDOW, F_ACK, sid, self._initial_grant(st, self._windows(sid)[0]))
            events.append(StreamOpened(sid))
        return st

    def _on_window(self, events: list, flags: int, sid: int, delta: int) -> None:
        st = self._stream_for(events, flags, sid)
        if st is None:
            return
        if delta:
            st.send_window += delta
            if st.send_window > 2**32:
                raise ProtocolError(f"peer granted an absurd window on stream {sid}")
        if (delta or flags & F_ACK) and not flags & F_RST:  # (credit on a stream being reset is news of nothing)
            events.append(WindowUpdated(sid))
        self._on_flags(events, flags, sid, st)

    def _on_flags(self, events: list, flags: int, sid: int, st: _StreamState) -> None:
        if flags & F_RST:
            self._remove(sid)
            events.append(StreamWasReset(sid))
            return
        if flags & F_FIN and not st.remote_fin:
            st.remote_fin = True
            events.append(StreamEnded(sid))
            self._maybe_forget(sid, st)

    def _maybe_forget(self, sid: int, st: _StreamState) -> None:
        if st.local_fin and st.remote_fin and st.buffered == 0:
            self._remove(sid)

    def _frame(self, ftype: int, flags: int, sid: int, length: int) -> None:
        self._tail += _HDR.pack(_VERSION, ftype, flags, sid, length)
