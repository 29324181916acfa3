"""Our replacements for parts of aioquic behave exactly like aioquic's own.

``transports/quic/_aioquic.py`` swaps in a header-protection path that copies less and a stream sender
that keeps chunks; both are checked here against the aioquic 1.7.2 code they replace, on the
same inputs: same bytes on the wire, same frames, same state after acknowledgements and losses.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from aioquic.quic import events as qev
from aioquic.quic.crypto import CryptoContext, CryptoError
from aioquic.quic.packet import QuicProtocolVersion
from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.stream import QuicStreamSender
from aioquic.tls import CipherSuite

from lattica.transports.quic._aioquic import _ChunkedSender, _LeanCryptoContext
from quic_pair import Pair, ours, theirs

SUITES = [CipherSuite.AES_128_GCM_SHA256, CipherSuite.AES_256_GCM_SHA384, CipherSuite.CHACHA20_POLY1305_SHA256]


def _contexts(suite: CipherSuite) -> tuple[CryptoContext, CryptoContext]:
    secret = os.urandom(48 if suite == CipherSuite.AES_256_GCM_SHA384 else 32)
    theirs, ours = CryptoContext(), _LeanCryptoContext()
    for ctx in (theirs, ours):
        ctx.setup(cipher_suite=suite, secret=secret, version=QuicProtocolVersion.VERSION_1)
    return theirs, ours


def _header(rng: random.Random, long: bool, pn_length: int, pn: int, key_phase: int = 0) -> bytes:
    if long:  # a Handshake packet: type, version, CIDs, length, packet number
        first = 0xC0 | 0x20 | (pn_length - 1)
        body = b"\x00\x00\x00\x01" + b"\x08" + rng.randbytes(8) + b"\x08" + rng.randbytes(8) + b"\x44\x00"
    else:
        first = 0x40 | (key_phase << 2) | (pn_length - 1)
        body = rng.randbytes(8)
    return bytes([first]) + body + (pn & ((1 << 8 * pn_length) - 1)).to_bytes(pn_length, "big")


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.name)
def test_packet_protection_is_byte_for_byte_aioquics(suite: CipherSuite) -> None:
    rng = random.Random(suite.value)
    theirs, ours = _contexts(suite)
    for i in range(200):
        long = i % 3 == 0
        pn_length = 1 + i % 4
        pn = rng.randrange(1 << 20)
        header = _header(rng, long, pn_length, pn)
        payload = rng.randbytes(rng.choice([4, 20, 1200, 16400, 64000]))
        sealed = theirs.encrypt_packet(header, payload, pn)
        assert ours.encrypt_packet(header, payload, pn) == sealed
        pn_offset = len(header) - pn_length
        opened = theirs.decrypt_packet(sealed, pn_offset, pn)
        assert ours.decrypt_packet(sealed, pn_offset, pn) == opened
        assert opened[:3] == (header, payload, pn)


def test_packet_protection_refuses_what_aioquic_refuses() -> None:
    theirs, ours = _contexts(CipherSuite.AES_128_GCM_SHA256)
    rng = random.Random(7)
    header = _header(rng, False, 2, 5)
    sealed = ours.encrypt_packet(header, b"x" * 100, 5)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    for ctx in (theirs, ours):
        with pytest.raises(CryptoError):
            ctx.decrypt_packet(tampered, len(header) - 2, 5)
        with pytest.raises(CryptoError):  # too short to take the header-protection sample
            ctx.decrypt_packet(sealed[: len(header) + 10], len(header) - 2, 5)
    other, _ = _contexts(CipherSuite.AES_128_GCM_SHA256)  # other keys
    with pytest.raises(CryptoError):
        ours.decrypt_packet(other.encrypt_packet(header, b"y" * 100, 5), len(header) - 2, 5)


def test_packet_protection_follows_a_key_update() -> None:
    """A packet in the next key phase opens with the next keys, as aioquic's does."""
    from aioquic.quic.crypto import next_key_phase

    theirs, ours = _contexts(CipherSuite.AES_128_GCM_SHA256)
    rng = random.Random(3)
    header = _header(rng, False, 2, 9, key_phase=1)
    sender = next_key_phase(theirs)
    sender.hp = theirs.hp  # (header protection keys do not change with a key update, RFC 9001 6)
    sealed = sender.encrypt_packet(header, b"z" * 300, 9)
    plain_header, payload, pn, updated = ours.decrypt_packet(sealed, len(header) - 2, 9)
    assert (plain_header, payload, pn, updated) == (header, b"z" * 300, 9, True)
    assert theirs.decrypt_packet(sealed, len(header) - 2, 9) == (plain_header, payload, pn, updated)


def _state(s: QuicStreamSender) -> tuple:
    return (
        s.buffer_is_empty,
        s.highest_offset,
        s.is_finished,
        s.reset_pending,
        s.next_offset,
        s._buffer_start,
        s._buffer_stop,
        s._buffer_fin,
        list(s._pending),
        list(s._acked),
    )


@pytest.mark.parametrize("seed", range(12))
def test_chunked_sender_sends_what_aioquics_sender_sends(seed: int) -> None:
    rng = random.Random(seed)
    theirs, ours = QuicStreamSender(stream_id=0, writable=True), _ChunkedSender(stream_id=0, writable=True)
    sent: list[tuple[int, int, bool]] = []  # frames in flight: (start, stop, fin)
    written = bytearray()
    fin_written = False
    for _ in range(400):
        op = rng.random()
        if op < 0.3 and not fin_written:
            data = rng.randbytes(rng.choice([1, 7, 100, 1500, 40000]))
            kind = rng.choice([bytes, bytearray, memoryview])
            end = rng.random() < 0.02
            for s in (theirs, ours):
                s.write(kind(data) if kind is not memoryview else memoryview(bytearray(data)), end_stream=end)
            written += data
            fin_written = end
        elif op < 0.7:
            max_size = rng.choice([0, 5, 1000, 16000, 70000])
            max_offset = rng.choice([None, len(written) // 2, len(written) + 10])
            a = theirs.get_frame(max_size, max_offset)
            b = ours.get_frame(max_size, max_offset)
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.data, a.offset, a.fin) == (b.data, b.offset, b.fin)
                assert bytes(written[a.offset : a.offset + len(a.data)]) == a.data
                sent.append((a.offset, a.offset + len(a.data), a.fin))
        elif sent:
            start, stop, fin = sent.pop(rng.randrange(len(sent)))
            delivery = QuicDeliveryState.ACKED if rng.random() < 0.8 else QuicDeliveryState.LOST
            for s in (theirs, ours):
                s.on_data_delivery(delivery, start, stop, fin)
        assert _state(ours) == _state(theirs)
    # acknowledge everything still in flight, resend what was lost: both finish alike
    for _ in range(10000):
        while sent:
            start, stop, fin = sent.pop()
            for s in (theirs, ours):
                s.on_data_delivery(QuicDeliveryState.ACKED, start, stop, fin)
        a, b = theirs.get_frame(1 << 20), ours.get_frame(1 << 20)
        assert (a is None) == (b is None)
        if a is None:
            break
        assert (a.data, a.offset, a.fin) == (b.data, b.offset, b.fin)
        sent.append((a.offset, a.offset + len(a.data), a.fin))
    assert _state(ours) == _state(theirs)
    assert ours._head <= len(ours._chunks)
    if theirs._buffer_start == theirs._buffer_stop:  # all acknowledged: no chunk kept alive
        assert all(not c for c in ours._chunks[: ours._head]) and ours._chunks[ours._head :] == []


def test_chunked_sender_keeps_a_bytes_write_by_reference_and_copies_a_mutable_one() -> None:
    s = _ChunkedSender(stream_id=0, writable=True)
    big = os.urandom(100_000)
    s.write(big)
    frame = s.get_frame(200_000)
    assert frame is not None and frame.data is big  # a whole chunk goes out without a copy
    buf = bytearray(b"abc")
    s.write(buf)
    buf[:] = b"xyz"  # the caller reuses its buffer: what was written stays written
    assert s.get_frame(10).data == b"abc"


def _received(evs: list, stream_id: int) -> bytes:
    return b"".join(e.data for e in evs if isinstance(e, qev.StreamDataReceived) and e.stream_id == stream_id)


@pytest.mark.parametrize("datagram", [*range(16_380, 16_440, 3), 32_800, 65_000])
def test_stream_frames_of_every_length_around_16k_fit_their_datagram(datagram: int) -> None:
    """A STREAM frame's length takes 2 bytes up to 16,383 and 4 beyond: frames near that edge,
    two streams sharing a datagram, every datagram size around it: nothing overflows, the peer
    (aioquic's own receiver) gets every byte, and big datagrams carry big frames."""
    p = Pair(ours(True, datagram=datagram), lambda odcid: theirs(False, odcid, datagram=datagram))
    rng = random.Random(datagram)
    sent: dict[int, bytes] = {}
    for _ in range(6):
        sid = p.client.get_next_available_stream_id()
        sent[sid] = rng.randbytes(rng.choice([1, 100, 16_380, 16_384, 16_390, 40_000, 70_000]))
        p.client.send_stream_data(sid, sent[sid], end_stream=True)
    sizes = p.pump()
    evs = p.events()["server"]
    for sid, data in sent.items():
        assert _received(evs, sid) == data
    assert max(sizes) <= datagram
    if datagram == 65_000:
        assert max(sizes) > 60_000


def test_a_stream_frame_never_outgrows_the_room_it_was_given() -> None:
    """_write_stream_frame at every amount of room around 16 KiB (the packet builder's datagram
    size walks across it): the frame plus its header fits, and the packet seals."""
    from aioquic import tls
    from aioquic.quic.packet import QuicPacketType
    from aioquic.quic.packet_builder import QuicPacketBuilder

    p = Pair(ours(True, datagram=65_000), lambda odcid: theirs(False, odcid, datagram=65_000))
    c = p.client
    space, crypto = c._spaces[tls.Epoch.ONE_RTT], c._cryptos[tls.Epoch.ONE_RTT]
    lengths = set()
    for size in range(16_380, 16_440):
        sid = c.get_next_available_stream_id()
        c.send_stream_data(sid, b"x" * 40_000)
        builder = QuicPacketBuilder(
            host_cid=c.host_cid,
            is_client=True,
            max_datagram_size=size,
            packet_number=c._packet_number,
            peer_cid=c._peer_cid.cid,
            version=c._version,
        )
        builder.start_packet(QuicPacketType.ONE_RTT, crypto)
        sent = c._write_stream_frame(builder, space, c._streams[sid], 1 << 40)
        datagrams, _ = builder.flush()  # (raises BufferWriteError if the frame overran)
        assert sent > 0 and len(datagrams[0]) <= size
        lengths.add(sent)
    assert min(lengths) < 16_384 <= max(lengths)  # both length forms were written


def test_out_of_order_bytes_count_against_the_connection_window() -> None:
    """A peer that sends one byte at the far end of each stream's window makes aioquic hold a
    zero-filled window per stream; those bytes are not read, so they must not come back as
    credit: the connection window (1 MiB) bounds them."""
    window = 256 * 1024
    p = Pair(theirs(True), lambda odcid: ours(False, odcid, max_data=1 << 20, max_stream_data=window))
    for i in range(3):  # (a hostile sender: aioquic's own, told its stream starts window - 1 in)
        sid = 4 * i
        p.client.send_stream_data(sid, b"")
        jump = QuicStreamSender(stream_id=sid, writable=True)
        jump._buffer_start = jump._buffer_stop = jump.highest_offset = window - 1
        jump.write(b"z")
        p.client._streams[sid].sender = jump
    p.pump()
    server = p.server
    assert server.held_out_of_order() == 3 * window  # 768 KiB held, none of it readable
    assert server.rx_unread == 0 and not any(isinstance(e, qev.StreamDataReceived) for e in p.events()["server"])
    assert server._local_max_data.sent == 1 << 20  # no credit handed back for them


def test_many_tiny_writes_share_chunks() -> None:
    """32-byte writes (a ping echo) cost about their bytes: copied into shared tail chunks."""
    s = _ChunkedSender(stream_id=0, writable=True)
    for i in range(10_000):
        s.write(i.to_bytes(32, "big"))
    assert len(s._chunks) <= 10_000 * 32 // (64 * 1024) + 1
    frame = s.get_frame(1 << 20)
    assert frame is not None and type(frame.data) is bytes
    assert frame.data == b"".join(i.to_bytes(32, "big") for i in range(10_000))


def test_a_reset_stream_keeps_aioquics_sender() -> None:
    """The chunked sender replaces only a sender that never sent or reset: a RESET_STREAM in
    flight reports to the sender that wrote it (and must be resent by it if lost)."""
    p = Pair(ours(True), lambda odcid: theirs(False, odcid))
    c = p.client
    sid = c.get_next_available_stream_id()
    c.reset_stream(sid, 0)
    with pytest.raises(RuntimeError):
        c.send_stream_data(sid, b"late")
    assert type(c._streams[sid].sender) is QuicStreamSender
    other = c.get_next_available_stream_id()
    c.send_stream_data(other, b"data")
    assert type(c._streams[other].sender) is _ChunkedSender


def test_big_datagrams_wait_for_the_handshake_and_the_peers_limit() -> None:
    """A datagram carrying an Initial is padded to the datagram size: every handshake datagram
    stays at 1,350 bytes on a 65,000-byte path (no padding to skip: aioquic does it a byte at a
    time), and data datagrams grow once the handshake is confirmed, up to the peer's
    max_udp_payload_size (aioquic alone parses it and sends larger datagrams anyway)."""
    sizes: list[int] = []
    client = ours(True, datagram=65_000)
    client.connect(("127.0.0.1", 40002), now=1000.0)
    sizes += [len(d) for d, _ in client.datagrams_to_send(1000.0)]
    assert sizes == [1350]

    handshake: list[int] = []
    real = Pair.pump

    def recording(self: Pair, *a: Any, **kw: Any) -> list[int]:
        got = real(self, *a, **kw)
        handshake.extend(got)
        return got

    Pair.pump = recording  # type: ignore[method-assign]
    try:
        p = Pair(ours(True, datagram=65_000), lambda odcid: ours(False, odcid, datagram=65_000))
    finally:
        Pair.pump = real  # type: ignore[method-assign]
    assert handshake and max(handshake) <= 1350
    p.client.send_stream_data(0, b"x" * 200_000, end_stream=True)
    assert max(p.pump()) > 60_000

    from aioquic.buffer import Buffer
    from aioquic.quic.packet import pull_quic_transport_parameters, push_quic_transport_parameters

    def limited(odcid: bytes) -> Any:
        server = theirs(False, odcid, datagram=65_000)
        plain = server._serialize_transport_parameters

        def with_limit() -> bytes:  # (a peer, like quic-go, that reads into 1,452-byte buffers)
            params = pull_quic_transport_parameters(Buffer(data=plain()))
            params.max_udp_payload_size = 1452
            buf = Buffer(capacity=4096)
            push_quic_transport_parameters(buf, params)
            return buf.data

        server._serialize_transport_parameters = with_limit
        return server

    p = Pair(ours(True, datagram=65_000), limited)
    p.client.send_stream_data(0, b"x" * 200_000, end_stream=True)
    sizes = p.pump()
    assert max(sizes) == 1452 and _received(p.events()["server"], 0) == b"x" * 200_000
