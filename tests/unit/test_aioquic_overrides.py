"""Our replacements for parts of aioquic behave exactly like aioquic's own.

``transports/_aioquic.py`` swaps in a header-protection path that copies less and a stream sender
that keeps chunks; both are checked here against the aioquic 1.7.2 code they replace, on the
same inputs: same bytes on the wire, same frames, same state after acknowledgements and losses.
"""

from __future__ import annotations

import os
import random

import pytest
from aioquic.quic.crypto import CryptoContext, CryptoError
from aioquic.quic.packet import QuicProtocolVersion
from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.stream import QuicStreamSender
from aioquic.tls import CipherSuite

from lattica.transports._aioquic import _ChunkedSender, _LeanCryptoContext

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
    return (s.buffer_is_empty, s.highest_offset, s.is_finished, s.reset_pending, s.next_offset,
            s._buffer_start, s._buffer_stop, s._buffer_fin, list(s._pending), list(s._acked))


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
