"""Every use of aioquic's private API, in one place (checked against aioquic 1.7.2).

``transports/quic/`` talks to aioquic through the documented ``QuicConnection`` methods and
the helpers below. Each private attribute or method used here carries a comment saying why it is
needed; ``check_compat()`` runs at import and fails loudly (ImportError) if a future aioquic
renamed something, instead of misbehaving at run time.

What we need beyond the public API:

- mutual TLS: aioquic's server only asks for a client certificate when ``tls.Context
  ._request_client_certificate`` is set ("for test purposes"); the peer's certificate is only
  reachable as ``tls.Context._peer_certificate`` / ``_peer_certificate_chain``.
- bounded receive memory: aioquic raises MAX_STREAM_DATA / MAX_DATA by doubling whenever the peer
  has *sent* half the window, whatever the application consumed. We override the two frame
  writers so credit follows what the application has read.
- stream limit: the bidirectional/unidirectional stream limits are hard-coded (128) in
  ``QuicConnection.__init__`` (``Limit`` objects; the unidirectional one is replaced by one that
  never grows: aioquic raises it each time a peer's stream is discarded).
- backpressure: the size of a stream's send buffer (unacknowledged + unsent bytes), and how much
  of it was never sent (what ``drain()`` bounds).
- receive windows that grow with the path: the smoothed RTT, and a connection window we widen.
- speed (docs/benchmarks.md, "QUIC, faster"): STREAM frames longer than 16 KiB in 64 KiB loopback
  datagrams (aioquic writes frame lengths as 2-byte varints); a stream sender that keeps writes
  as chunks (aioquic's bytearray reallocates under hundreds of MiB queued and copies each frame
  twice); header protection that copies only the header (aioquic copies the packet 3 times).
- prompt close detection: a received CONNECTION_CLOSE only becomes an event after the draining
  period (3 PTO); the state change is visible earlier.
- pacing vs. coarse timers: the pacer's burst cap (16 datagrams) makes a timer that fires 1 ms
  late throttle the connection; we replace the pacer with one that keeps 2 ms of credit.
- packet header parsing needs ``aioquic.buffer.Buffer`` to feed ``pull_quic_header``.
"""

from __future__ import annotations

import ssl
from bisect import bisect_right
from typing import TYPE_CHECKING, cast

import aioquic
from aioquic import tls
from aioquic._crypto import CryptoError
from aioquic.buffer import Buffer, size_uint_var
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import (
    CONNECTION_LIMIT_FRAME_CAPACITY,
    MAX_STREAM_DATA_FRAME_CAPACITY,
    Limit,
    QuicConnection,
    QuicConnectionState,
)
from aioquic.quic.crypto import CryptoContext, KeyUnavailableError, next_key_phase
from aioquic.quic.packet import (
    QuicFrameType,
    QuicPacketType,
    QuicStreamFrame,
    decode_packet_number,
    pull_quic_header,
    pull_quic_transport_parameters,
)
from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.recovery import QuicPacketPacer
from aioquic.quic.stream import QuicStreamSender

if TYPE_CHECKING:  # (private classes: at run time only check_compat imports them)
    from aioquic._crypto import AEAD, HeaderProtection
    from aioquic.quic.packet_builder import QuicPacketBuilder
    from aioquic.quic.recovery import QuicPacketSpace
    from aioquic.quic.stream import QuicStream

# Documented aioquic API used here: QuicConnection, QuicConfiguration, events, pull_quic_header.
# Internal modules and names (all checked against aioquic 1.7.2):
# - Buffer (aioquic.buffer): what pull_quic_header reads from; BufferReadError is a ValueError;
# - QuicPacketType: to tell a client Initial from other long-header packets;
# - QuicFrameType, *_FRAME_CAPACITY: used by the two overridden frame writers, exactly as
#   aioquic's own implementations use them;
# - QuicConnectionState: the closing/draining/first-flight probes;
# - QuicPacketPacer (aioquic.quic.recovery): base class of our pacer;
# - QuicStreamSender (aioquic.quic.stream): base class of the chunked sender, whose RangeSets of
#   pending/acknowledged offsets and FIN/reset state it keeps as aioquic does;
# - CryptoContext, next_key_phase, decode_packet_number, KeyUnavailableError, CryptoError: the
#   lean packet protection, which mirrors CryptoContext.encrypt_packet/decrypt_packet;
# - QuicStreamFrame, QuicDeliveryState: what a sender returns and is told.

__all__ = [
    "CHECKED_VERSION",
    "LatticaQuicConnection",
    "long_header",
    "make_configuration",
    "check_compat",
]

CHECKED_VERSION = "1.7.2"

# Datagrams of a connection stay this small until its handshake completed (LatticaQuicConnection).
HANDSHAKE_DATAGRAM = 1350

# The pacer may release at least this much sending time in one burst (see _CoarseTimerPacer).
PACER_MIN_BURST = 0.002

# Connection states after which nothing more is sent or received (aioquic 1.7.2 END_STATES).
_ENDING = (
    QuicConnectionState.CLOSING,
    QuicConnectionState.DRAINING,
    QuicConnectionState.TERMINATED,
)


class _CoarseTimerPacer(QuicPacketPacer):
    """aioquic's pacer, but a burst may cover at least PACER_MIN_BURST seconds of sending.

    aioquic 1.7.2 caps a burst at 16 datagrams' worth of time. Event-loop timers are coarse
    (libuv, hence uvloop, rounds to 1 ms; a busy loop fires late), and the pacer drops the time
    that overshoots the cap, so one connection could never send more than 16 datagrams per
    timer tick: with uvloop, 16 x 16000 B per ms = 262 MB/s on loopback and 22 MB/s with
    1350-byte datagrams on a WAN. Keeping two milliseconds of credit removes that ceiling while
    pacing still spreads a congestion window over the RTT.
    """

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        super().update_rate(congestion_window, smoothed_rtt)
        if self.bucket_max < PACER_MIN_BURST:
            self.bucket_max = PACER_MIN_BURST


class _LeanCryptoContext(CryptoContext):
    """aioquic's packet protection with header protection applied to the header only.

    aioquic 1.7.2 copies the whole packet three times to flip a few header bits when sealing
    (header + payload, bytearray, bytes) and once when opening; at 64 KiB datagrams that was a
    sixth of the sender's time. Same keys, same bytes on the wire (RFC 9001 5.3-5.4); installed
    on a connection's 1-RTT contexts, whose keys and key phase aioquic keeps managing.
    """

    def encrypt_packet(self, plain_header: bytes, plain_payload: bytes, packet_number: int) -> bytes:
        aead, hp = self.aead, self.hp
        assert aead is not None and hp is not None, "Encryption key is not available"  # (set and cleared together)
        protected = aead.encrypt(plain_payload, plain_header, packet_number)
        pn_length = (plain_header[0] & 0x03) + 1
        pn_offset = len(plain_header) - pn_length
        sample_at = 4 - pn_length  # the sample starts 4 bytes after the packet number's start
        mask = hp._mask(protected[sample_at : sample_at + 16])
        header = bytearray(plain_header)
        header[0] ^= mask[0] & (0x0F if header[0] & 0x80 else 0x1F)
        for i in range(pn_length):
            header[pn_offset + i] ^= mask[1 + i]
        return bytes(header) + protected

    def decrypt_packet(
        self, packet: bytes, encrypted_offset: int, expected_packet_number: int
    ) -> tuple[bytes, bytes, int, bool]:
        if self.aead is None:
            raise KeyUnavailableError("Decryption key is not available")
        sample_at = encrypted_offset + 4
        if sample_at + 16 > len(packet):
            raise CryptoError("Packet is too short to sample")
        mask = cast("HeaderProtection", self.hp)._mask(packet[sample_at : sample_at + 16])  # (set with aead)
        header = bytearray(packet[:sample_at])
        first = header[0] = header[0] ^ (mask[0] & (0x0F if header[0] & 0x80 else 0x1F))
        pn_length = (first & 0x03) + 1
        truncated = 0
        for i in range(pn_length):
            b = header[encrypted_offset + i] = header[encrypted_offset + i] ^ mask[1 + i]
            truncated = (truncated << 8) | b
        plain_header = bytes(header[: encrypted_offset + pn_length])
        packet_number = decode_packet_number(truncated, pn_length * 8, expected_packet_number)
        crypto: CryptoContext = self
        if not first & 0x80 and ((first & 4) >> 2) != self.key_phase:
            crypto = next_key_phase(self)  # (aioquic's key update, unchanged)
        aead = cast("AEAD", crypto.aead)  # (ours checked above; a next key phase's is set up)
        # (aioquic's C AEAD reads any buffer; its stub says bytes)
        payload = aead.decrypt(memoryview(packet)[len(plain_header) :], plain_header, packet_number)  # type: ignore[arg-type]
        return plain_header, payload, packet_number, crypto is not self


_SMALL_WRITE = 4096  # writes below this are copied into a shared tail chunk ...
_TAIL_CHUNK = 64 * 1024  # ... while it is below this size


class _ChunkedSender(QuicStreamSender):
    """aioquic's stream sender, keeping written data as a list of chunks instead of one bytearray.

    aioquic 1.7.2 appends every write to one bytearray and cuts acknowledged bytes off its front:
    with hundreds of MiB queued (1,000 calls of 256 KiB in flight) the appends reallocate and
    move the whole buffer, and every frame is copied twice (slice, then bytes()). Here a write
    of ``bytes`` is kept by reference, a frame is at most one copy (none when it is a whole
    chunk), and acknowledged chunks are dropped in O(1). Writes under 4 KiB are copied into a
    shared tail chunk instead, so many tiny writes cost about their bytes, as in aioquic.
    Retransmission, FIN and reset logic are aioquic's (RangeSets of pending and acknowledged
    offsets, unchanged).
    """

    def __init__(self, stream_id: int | None, writable: bool) -> None:
        super().__init__(stream_id=stream_id, writable=writable)
        self._chunks: list[bytes | bytearray] = []
        self._starts: list[int] = []  # stream offset of each chunk
        self._head = 0  # chunks before this index are fully acknowledged

    def write(self, data: bytes, end_stream: bool = False) -> None:
        if self._buffer_fin is not None:
            raise RuntimeError("Cannot send data after FIN")
        if self._reset_error_code is not None:
            raise RuntimeError("Cannot send data after the stream was reset")
        if type(data) is not bytes and len(data) >= _SMALL_WRITE:
            data = bytes(data)  # a caller may reuse a bytearray (and a memoryview counts items)
        size = len(data) if type(data) is bytes else memoryview(data).nbytes
        if size:
            self.buffer_is_empty = False
            self._pending.add(self._buffer_stop, self._buffer_stop + size)
            chunks = self._chunks
            if size < _SMALL_WRITE:  # copied into a shared tail, so a chunk's overhead stays small
                tail = chunks[-1] if len(chunks) > self._head else None
                if type(tail) is bytearray and len(tail) < _TAIL_CHUNK:
                    tail += data
                else:
                    chunks.append(bytearray(data))
                    self._starts.append(self._buffer_stop)
            else:
                chunks.append(data)
                self._starts.append(self._buffer_stop)
            self._buffer_stop += size
        if end_stream:
            self.buffer_is_empty = False
            self._buffer_fin = self._buffer_stop
            self._pending_eof = True

    def _slice(self, start: int, stop: int) -> bytes:
        chunks, starts = self._chunks, self._starts
        i = bisect_right(starts, start, self._head) - 1
        chunk = chunks[i]
        off = start - starts[i]
        if stop - starts[i] <= len(chunk):
            if type(chunk) is bytearray:  # (a shared tail of small writes: aioquic wants bytes)
                return bytes(memoryview(chunk)[off : stop - starts[i]])
            whole = cast(bytes, chunk)  # (not the tail: a write kept as it came)
            return whole if off == 0 and stop - start == len(whole) else whole[off : stop - starts[i]]
        parts = [chunk[off:]]
        i += 1
        while starts[i] + len(chunks[i]) < stop:
            parts.append(chunks[i])
            i += 1
        parts.append(chunks[i][: stop - starts[i]])
        return b"".join(parts)

    def get_frame(self, max_size: int, max_offset: int | None = None) -> QuicStreamFrame | None:
        assert self._reset_error_code is None, "cannot call get_frame() after reset()"
        if max_size < 0:
            return None
        try:
            r = self._pending[0]
        except IndexError:
            if self._pending_eof:
                self._pending_eof = False
                assert self._buffer_fin is not None  # (a pending FIN has its offset)
                return QuicStreamFrame(fin=True, offset=self._buffer_fin)
            self.buffer_is_empty = True
            return None
        start = r.start
        stop = min(r.stop, start + max_size)
        if max_offset is not None and stop > max_offset:
            stop = max_offset
        if stop <= start:
            return None
        frame = QuicStreamFrame(data=self._slice(start, stop), offset=start)
        self._pending.subtract(start, stop)
        if stop > self.highest_offset:
            self.highest_offset = stop
        if self._buffer_fin == stop:
            frame.fin = True
            self._pending_eof = False
        return frame

    def on_data_delivery(self, delivery: QuicDeliveryState, start: int, stop: int, fin: bool) -> None:
        if self._reset_error_code is not None or delivery != QuicDeliveryState.ACKED:
            super().on_data_delivery(delivery, start, stop, fin)  # (touches no buffer)
            return
        if stop > start:
            self._acked.add(start, stop)
            first_range = self._acked[0]
            if first_range.start == self._buffer_start:
                self._acked.shift()
                self._buffer_start = first_range.stop
                self._drop_acked()
        if fin:
            self._acked_fin = True
        if self._buffer_start == self._buffer_fin and self._acked_fin:
            self.is_finished = True

    def _drop_acked(self) -> None:
        chunks, starts, head, edge = self._chunks, self._starts, self._head, self._buffer_start
        n = len(chunks)
        while head < n and starts[head] + len(chunks[head]) <= edge:
            chunks[head] = b""  # (the bytes are freed now, the slot when the lists are compacted)
            head += 1
        if head > 64 and head * 2 > n:
            del chunks[:head], starts[:head]
            head = 0
        self._head = head


class _PinnedLimit(Limit):
    """A peer stream limit that never grows: the one control stream each side may open."""

    def __init__(self, like: Limit, value: int) -> None:
        super().__init__(like.frame_type, like.name, value)

    @property
    def value(self) -> int:
        return self.sent

    @value.setter
    def value(self, _: int) -> None:
        pass


class LatticaQuicConnection(QuicConnection):
    """aioquic's QuicConnection with mutual TLS, a configurable stream limit, and receive credit
    that follows application reads (so an app that stops reading bounds our memory)."""

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        max_streams: int,
        original_destination_connection_id: bytes | None = None,
    ) -> None:
        super().__init__(
            configuration=configuration,
            original_destination_connection_id=original_destination_connection_id,
        )
        # PRIVATE (aioquic 1.7.2): the stream limits are Limit objects created in __init__ with a
        # hard-coded value of 128; they are sent as transport parameters by _initialize(), which
        # runs later (connect() / first datagram), so setting them here takes effect. Streams are
        # bidirectional, but for one unidirectional control stream per side (its GOAWAY: wire.py).
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = max_streams
        # (pinned: aioquic raises a stream limit by one each time a peer's stream is discarded)
        self._local_max_streams_uni = _PinnedLimit(self._local_max_streams_uni, 1)
        # PRIVATE (aioquic 1.7.2): QuicPacketRecovery._pacer is created in its __init__ and only
        # used through next_send_time / update_after_send / update_rate, which our subclass keeps.
        self._loss._pacer = _CoarseTimerPacer(max_datagram_size=configuration.max_datagram_size)
        self._stream_window = configuration.max_stream_data
        self._conn_window = self._conn_window_base = configuration.max_data
        # PRIVATE (aioquic 1.7.2): _max_datagram_size sizes every datagram datagrams_to_send()
        # builds (recovery, congestion control and pacer took theirs in __init__). Datagrams
        # above HANDSHAKE_DATAGRAM wait until the handshake is confirmed (a datagram carrying an
        # Initial is padded to the full size, and aioquic skips padding a byte at a time in
        # Python: 65,000 bytes of it cost the receiver 2.4 ms), and are capped by the peer's
        # max_udp_payload_size, which aioquic parses but does not honour.
        self._full_datagram: int | None = None
        self._peer_max_payload = 65527  # RFC 9000 18.2: the default when a peer sends none
        if self._max_datagram_size > HANDSHAKE_DATAGRAM:
            self._full_datagram, self._max_datagram_size = self._max_datagram_size, HANDSHAKE_DATAGRAM
        # Receive credit book-keeping, written by transports/quic/connection.py and stream.py:
        #   rx_stream_limit[stream_id]: the MAX_STREAM_DATA we want to advertise (read + window);
        #   rx_unread: bytes handed to stream buffers that the application has not read yet.
        self.rx_stream_limit: dict[int, int] = {}
        self.rx_unread = 0

    # -- datagram size --------------------------------------------------------------------------

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple]]:
        if self._full_datagram is not None and self._handshake_confirmed:
            self._max_datagram_size = max(HANDSHAKE_DATAGRAM, min(self._full_datagram, self._peer_max_payload))
            self._full_datagram = None
        return super().datagrams_to_send(now)

    def _parse_transport_parameters(self, data: bytes, from_session_ticket: bool = False) -> None:
        # PRIVATE override (aioquic 1.7.2): aioquic validates the peer's max_udp_payload_size
        # and then ignores it; we keep it to cap our datagrams once the handshake completes.
        super()._parse_transport_parameters(data, from_session_ticket)
        limit = pull_quic_transport_parameters(Buffer(data=data)).max_udp_payload_size
        if limit is not None:
            self._peer_max_payload = limit

    # -- mutual TLS ---------------------------------------------------------------------------

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        # PRIVATE (aioquic 1.7.2): _cryptos[ONE_RTT] is a CryptoPair made here; its two contexts
        # live as long as the connection (key updates copy new keys into them).
        pair = self._cryptos[tls.Epoch.ONE_RTT]
        pair.send.__class__ = pair.recv.__class__ = _LeanCryptoContext
        if not self._is_client:
            # PRIVATE (aioquic 1.7.2): tls.Context is created inside _initialize(); the only way to
            # make the server send a CertificateRequest is this flag ("for test purposes only" in
            # aioquic). The client answers with its certificate because configuration.certificate
            # and private_key are set. An empty client Certificate is accepted by aioquic, which is
            # why transports/quic/connection.py rejects a missing peer certificate itself.
            self.tls._request_client_certificate = True

    def negotiated_alpn(self) -> str | None:
        """The application protocol the handshake agreed on, once the ClientHello was read
        (a server knows it before the handshake completes; None before)."""
        tls = getattr(self, "tls", None)
        # PUBLIC but undocumented (aioquic 1.7.2): tls.Context.alpn_negotiated is set when the
        # server reads the ClientHello (HandshakeCompleted carries it only at the end)
        return getattr(tls, "alpn_negotiated", None)

    def peer_certificate_chain(self) -> list:
        """The peer's certificate chain as sent (leaf first), empty if it sent none."""
        tls = getattr(self, "tls", None)
        if tls is None:
            return []
        # PRIVATE (aioquic 1.7.2): the parsed peer certificates are kept in these attributes
        # only; there is no public accessor.
        leaf = tls._peer_certificate
        if leaf is None:
            return []
        return [leaf, *tls._peer_certificate_chain]

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        # PRIVATE (aioquic 1.7.2): QuicStream.sender is a QuicStreamSender made in QuicStream's
        # __init__; a stream's sender is swapped for the chunked one before its first byte.
        stream = self._get_or_create_stream_for_send(stream_id)
        sender = stream.sender
        if (
            type(sender) is QuicStreamSender
            and sender._buffer_stop == 0
            and sender._buffer_fin is None
            and sender._reset_error_code is None  # (a reset one keeps aioquic's: its RESET_STREAM
            and not sender.is_finished  # in flight reports to it; it never carries data anyway)
        ):
            stream.sender = sender = _ChunkedSender(stream_id=stream_id, writable=True)
        sender.write(data, end_stream=end_stream)

    # -- STREAM frames longer than 16 KiB ----------------------------------------------------

    def _write_stream_frame(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream, max_offset: int
    ) -> int:
        # PRIVATE override (aioquic 1.7.2 QuicConnection._write_stream_frame): aioquic writes a
        # STREAM frame's length as a 2-byte varint, so one frame carries < 16 KiB and a datagram
        # holds one frame per stream. Where the path takes bigger datagrams (loopback: 64 KiB)
        # the length is written as a 4-byte varint instead; frames that fit keep the 2-byte form.
        # Otherwise identical to aioquic's (same flow-control bound and delivery handler).
        sender = stream.sender
        stream_id = cast(int, stream.stream_id)  # (a stream that has frames to send has its id)
        offset_size = size_uint_var(sender.next_offset) if sender.next_offset else 0
        room = builder.remaining_flight_space - 1 - size_uint_var(stream_id) - offset_size
        length_size = 4 if room - 2 > 16383 else 2  # (a frame that could reach 16 KiB needs 4)
        previous_send_highest = sender.highest_offset
        frame = sender.get_frame(room - length_size, max_offset)
        if frame is None:
            return 0
        frame_type = QuicFrameType.STREAM_BASE | 2  # length present
        if frame.offset:
            frame_type |= 4
        if frame.fin:
            frame_type |= 1
        data = frame.data
        buf = builder.start_frame(
            frame_type,
            capacity=1 + size_uint_var(stream_id) + offset_size + length_size,
            handler=sender.on_data_delivery,
            handler_args=(frame.offset, frame.offset + len(data), frame.fin),
        )
        buf.push_uint_var(stream_id)
        if frame.offset:
            buf.push_uint_var(frame.offset)
        if len(data) < 16384:
            buf.push_uint16(len(data) | 0x4000)
        else:
            buf.push_uint32(len(data) | 0x80000000)
        buf.push_bytes(data)
        return sender.highest_offset - previous_send_highest

    # -- receive credit follows application reads ------------------------------------------

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream) -> None:
        # PRIVATE override (aioquic 1.7.2 QuicConnection._write_stream_limits): aioquic doubles
        # stream.max_stream_data_local whenever the peer has sent past half of it, regardless of
        # what the application consumed — unbounded memory if the app stops reading. We advertise
        # exactly what transports/quic/ asked for (bytes read + window) and otherwise keep the
        # frame encoding and delivery handler of aioquic's own implementation.
        stream_id = cast(int, stream.stream_id)  # (aioquic asks only about streams that have their ids)
        target = self.rx_stream_limit.get(stream_id)
        if target is not None and target > stream.max_stream_data_local:
            stream.max_stream_data_local = target
        if stream.max_stream_data_local and stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        # PRIVATE override (aioquic 1.7.2 QuicConnection._write_connection_limits): same reason
        # as above for MAX_DATA. Credit = bytes received and no longer held, neither unread by
        # the app nor kept by aioquic out of order (``used`` counts every byte up to each
        # stream's highest offset, including final sizes of reset streams) plus the window;
        # raised in steps of a quarter window so we do not send MAX_DATA in every packet.
        # MAX_STREAMS handling is aioquic's, unchanged.
        max_data = self._local_max_data
        if self.conn_credit_due():
            max_data.value = max_data.used - self.rx_unread - self.held_out_of_order() + self._conn_window
        for limit in (max_data, self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit is not max_data and (limit.sent - limit.used >= limit.value - limit.sent):
                continue  # aioquic's MAX_STREAMS batching
            if limit.value != limit.sent:
                buf = builder.start_frame(
                    limit.frame_type,
                    capacity=CONNECTION_LIMIT_FRAME_CAPACITY,
                    handler=self._on_connection_limit_delivery,
                    handler_args=(limit,),
                )
                buf.push_uint_var(limit.value)
                limit.sent = limit.value

    def set_connection_window(self, window: int) -> None:
        """The connection's receive window from now on: ``window``, never below max_data."""
        self._conn_window = max(window, self._conn_window_base)

    def widen_connection_window(self, base: int) -> None:
        """The connection's window is never below ``base`` from now on (it began narrower:
        a peer not trusted yet); the raised MAX_DATA goes out with the next packet."""
        self._conn_window_base = max(self._conn_window_base, base)
        self._conn_window = max(self._conn_window, self._conn_window_base)

    def held_out_of_order(self) -> int:
        """Bytes aioquic keeps for streams behind a gap (not yet delivered in order), gaps included."""
        # PRIVATE (aioquic 1.7.2): QuicStreamReceiver._buffer holds everything from the first
        # byte not yet delivered to the highest offset received, zero-filled where data is
        # missing; it is emptied as data is delivered in order.
        return sum(len(s.receiver._buffer) for s in self._streams.values())

    def smoothed_rtt(self) -> float:
        """The path's smoothed round trip in seconds, 0.0 before the first sample."""
        # PRIVATE (aioquic 1.7.2): QuicPacketRecovery keeps its RTT estimate in these attributes.
        loss = self._loss
        return loss._rtt_smoothed if loss._rtt_initialized else 0.0

    def conn_credit_due(self) -> bool:
        """True when application reads freed enough connection credit to send MAX_DATA now."""
        # PRIVATE (aioquic 1.7.2): _local_max_data is the Limit behind MAX_DATA.
        max_data = self._local_max_data
        quarter = self._conn_window // 4
        free = max_data.used - self.rx_unread + self._conn_window - max_data.value
        # (the sum over streams only when the cheap bound says credit may be due)
        return free >= quarter and free - self.held_out_of_order() >= quarter

    # -- probes ------------------------------------------------------------------------------

    def send_buffered(self, stream_id: int) -> int:
        """Bytes of ``stream_id`` queued in aioquic and not yet acknowledged by the peer."""
        # PRIVATE (aioquic 1.7.2): QuicConnection._streams and QuicStreamSender's buffer bounds;
        # the sender keeps everything from the first unacknowledged byte to the last written one.
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return sender._buffer_stop - sender._buffer_start

    def send_backlog(self, stream_id: int) -> tuple[int, int]:
        """(bytes written but never sent, bytes held: unsent + sent and not yet acknowledged)."""
        # PRIVATE (aioquic 1.7.2): as send_buffered(); highest_offset is the end of what was sent.
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0, 0
        sender = stream.sender
        start, stop = sender._buffer_start, sender._buffer_stop
        return stop - max(sender.highest_offset, start), stop - start

    def total_send_buffered(self) -> int:
        """Bytes queued in aioquic and not yet acknowledged, over all streams."""
        # PRIVATE (aioquic 1.7.2): same attributes as send_buffered().
        return sum(s.sender._buffer_stop - s.sender._buffer_start for s in self._streams.values())

    def ending(self) -> events.ConnectionTerminated | None:
        """Why the connection is closing (locally, by the peer, or by a protocol error), if it is.

        aioquic reports ConnectionTerminated only after the closing/draining period; this lets us
        fail streams as soon as a CONNECTION_CLOSE is sent or received.
        """
        # PRIVATE (aioquic 1.7.2): _state and _close_event.
        if self._state in _ENDING or self._close_event is not None:
            return self._close_event
        return None

    def nothing_decrypted(self) -> bool:
        """True while no packet of this connection could be decrypted (garbage Initial)."""
        # PRIVATE (aioquic 1.7.2): a server connection leaves FIRSTFLIGHT on its first packet
        # that decrypts; one still there after its first datagram was fed junk.
        return self._state == QuicConnectionState.FIRSTFLIGHT

    def heard_handshake(self) -> bool:
        """Whether a Handshake packet of the peer decrypted (its second flight: a spoofed
        source never sends one, as it never sees our answer)."""
        # PRIVATE (aioquic 1.7.2): as in last_authenticated
        space = self._spaces.get(tls.Epoch.HANDSHAKE)
        return space is not None and space.largest_received_time is not None

    def last_authenticated(self) -> float | None:
        """When a packet of this connection last decrypted (the time it was fed in), or None:
        only such packets prove the peer is there (anyone can send a datagram from its address)."""
        # PRIVATE (aioquic 1.7.2): each packet number space records the arrival of its newest
        # packet, set only once the packet decrypted.
        times = [sp.largest_received_time for sp in self._spaces.values() if sp.largest_received_time is not None]
        return max(times) if times else None

    def remote_max_streams_bidi(self) -> int:
        """The peer's current bidirectional stream credit (cumulative stream count)."""
        # PRIVATE (aioquic 1.7.2): from the peer's transport parameters / MAX_STREAMS frames.
        return self._remote_max_streams_bidi


def make_configuration(
    *,
    is_client: bool,
    certificate: object,
    private_key: object,
    alpn: tuple[str, ...],
    idle_timeout: float,
    max_data: int,
    max_stream_data: int,
    max_datagram_size: int,
    congestion_control: str,
    cid_length: int,
) -> QuicConfiguration:
    """A QuicConfiguration for one libp2p-style connection (our own cert; no CA checks)."""
    config = QuicConfiguration(
        is_client=is_client,
        alpn_protocols=list(alpn),  # (a server picks the first of its own the client offers)
        connection_id_length=cid_length,
        idle_timeout=idle_timeout,
        max_data=max_data,
        max_stream_data=max_stream_data,
        max_datagram_size=max_datagram_size,
        congestion_control_algorithm=congestion_control,
        # Peers are verified by their libp2p certificate extension after the handshake, not by
        # a CA: aioquic's chain/hostname check must be off on both sides.
        verify_mode=ssl.CERT_NONE,
        # No SNI: the libp2p TLS spec says clients MUST NOT send a server name.
        server_name=None,
    )
    # SEMI-PRIVATE (aioquic 1.7.2): `certificate` and `private_key` are QuicConfiguration fields
    # marked "for internal purposes, not guaranteed to be stable"; the public way is
    # load_cert_chain() from PEM files, which would mean writing our ephemeral key to disk.
    config.certificate = certificate
    config.private_key = private_key
    return config


def long_header(data: bytes) -> tuple[bytes, bool, int | None]:
    """(destination CID, is a client Initial, version) of a long-header packet.

    Raises ValueError for anything that is not a parsable QUIC long header.
    """
    # INTERNAL (aioquic 1.7.2): Buffer and QuicPacketType, see the imports.
    header = pull_quic_header(Buffer(data=data), host_cid_length=8)
    return header.destination_cid, header.packet_type == QuicPacketType.INITIAL, header.version


def check_compat() -> None:
    """Fail at import (ImportError) if this aioquic lacks a private attribute we rely on."""
    probe = QuicConnection(configuration=QuicConfiguration(is_client=True))
    missing = [
        name
        for name in (
            "_local_max_streams_bidi",
            "_local_max_streams_uni",
            "_local_max_data",
            "_streams",
            "_state",
            "_close_event",
            "_remote_max_streams_bidi",
            "_is_client",
            "_initialize",
            "_write_stream_limits",
            "_write_connection_limits",
            "_on_max_stream_data_delivery",
            "_on_connection_limit_delivery",
            "_loss",
            "_get_or_create_stream_for_send",
            "_write_stream_frame",
            "_remote_max_data",
            "_max_datagram_size",
            "_handshake_confirmed",
            "_parse_transport_parameters",
        )
        if not hasattr(probe, name)
    ]
    if missing:  # the attribute checks below would fail with AttributeError
        raise ImportError(
            f"aioquic {aioquic.__version__} lacks private API that lattica's QUIC transport "
            f"needs (checked against {CHECKED_VERSION}): {', '.join(missing)}"
        )
    if not isinstance(getattr(probe._loss, "_pacer", None), QuicPacketPacer):
        missing.append("QuicPacketRecovery._pacer")
    for name in ("_rtt_smoothed", "_rtt_initialized"):
        if not hasattr(probe._loss, name):
            missing.append(f"QuicPacketRecovery.{name}")
    for name in ("bucket_max", "update_rate", "next_send_time", "update_after_send"):
        if not hasattr(QuicPacketPacer(max_datagram_size=1200), name):
            missing.append(f"QuicPacketPacer.{name}")
    for name in ("used", "sent", "value", "frame_type"):
        if not hasattr(probe._local_max_data, name):
            missing.append(f"Limit.{name}")
    # the private classes are imported only by this start-up check, once
    from aioquic.quic.stream import QuicStream  # (see above)
    from aioquic.tls import Context  # (see above)

    for name in ("max_stream_data_local", "max_stream_data_local_sent", "sender", "stream_id"):
        if not hasattr(QuicStream(stream_id=0), name):
            missing.append(f"QuicStream.{name}")
    sender = QuicStreamSender(stream_id=0, writable=True)
    for name in (
        "_buffer_start",
        "_buffer_stop",
        "_buffer_fin",
        "_pending",
        "_pending_eof",
        "_acked",
        "_acked_fin",
        "_reset_error_code",
        "highest_offset",
        "buffer_is_empty",
        "reset_pending",
    ):
        if not hasattr(sender, name):
            missing.append(f"QuicStreamSender.{name}")
    crypto = CryptoContext()
    for name in ("aead", "hp", "key_phase", "is_valid"):
        if not hasattr(crypto, name):
            missing.append(f"CryptoContext.{name}")
    from aioquic._crypto import HeaderProtection  # (see above)

    if not hasattr(HeaderProtection, "_mask"):
        missing.append("HeaderProtection._mask")
    ctx = Context(is_client=False)
    for name in ("_request_client_certificate", "_peer_certificate", "_peer_certificate_chain"):
        if not hasattr(ctx, name):
            missing.append(f"tls.Context.{name}")
    if missing:
        raise ImportError(
            f"aioquic {aioquic.__version__} lacks private API that lattica's QUIC transport "
            f"needs (checked against {CHECKED_VERSION}): {', '.join(missing)}"
        )


check_compat()
