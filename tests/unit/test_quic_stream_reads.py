"""Reads of a QUIC stream (transports/quic/stream.py ``QuicStream._take``): each costs the bytes it
returns, however large the chunk aioquic handed over, and the receive accounting stays exact."""

from __future__ import annotations

import asyncio
import random

import pytest

from lattica.errors import StreamReset
from lattica.transports.quic.stream import QuicStream

KiB, MiB = 1024, 1024 * 1024


class _Quic:
    def __init__(self) -> None:
        self.rx_unread = 0
        self.rx_stream_limit: dict[int, int] = {}
        self.reset: list[int] = []

    def smoothed_rtt(self) -> float:
        return 0.010

    def set_connection_window(self, window: int) -> None:
        pass

    def conn_credit_due(self) -> bool:
        return False

    def reset_stream(self, stream_id: int, code: int) -> None:
        self.reset.append(stream_id)

    def stop_stream(self, stream_id: int, code: int) -> None:
        pass


class _Conn:
    def __init__(self) -> None:
        self._quic = _Quic()
        self._loop = asyncio.new_event_loop()
        self._stream_window = 256 * KiB
        self._max_window = 256 * KiB
        self._closed_exc: Exception | None = None

    def _schedule_flush(self) -> None:
        pass

    def _windows_changed(self) -> None:
        pass

    def _maybe_retire(self, s: QuicStream) -> None:
        pass


class _Counted(bytes):
    """A chunk whose slices are counted (and counted again when they are sliced in turn)."""

    copied = 0

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        part = super().__getitem__(key)
        if isinstance(key, slice):
            _Counted.copied += len(part)
            return _Counted(part)
        return part


def _stream() -> tuple[QuicStream, _Conn]:
    conn = _Conn()
    return QuicStream(conn, 0, outbound=False), conn  # type: ignore[arg-type]


def _run(conn: _Conn, coro):  # type: ignore[no-untyped-def]
    return conn._loop.run_until_complete(coro)


def test_one_huge_chunk_read_32_bytes_at_a_time_copies_each_byte_once() -> None:
    """The hostile ping stream: 8 MiB arrive as one chunk and the handler reads 32 bytes at a time.
    Copying the chunk's rest on each read is ~1 TB of memcpy; here every read copies its 32 bytes."""
    s, conn = _stream()
    chunk = bytes(range(256)) * (8 * MiB // 256)
    s._on_data(_Counted(chunk), False)
    _Counted.copied = 0

    async def read_all() -> int:
        got = 0
        while got < len(chunk):
            part = await s.read(32)
            assert part == chunk[got : got + 32]
            got += len(part)
            assert _Counted.copied <= 2 * got  # fails at the first read when the rest is copied
        return got

    assert _run(conn, read_all()) == 8 * MiB
    assert _Counted.copied == 8 * MiB
    assert s._buf_len == 0 and conn._quic.rx_unread == 0 and s._consumed == 8 * MiB
    conn._loop.close()


def test_whole_chunk_reads_hand_the_chunk_itself_over() -> None:
    s, conn = _stream()
    chunks = [bytes([i]) * (64 * KiB) for i in range(4)]
    for c in chunks:
        s._on_data(c, False)
    for c in chunks:
        assert _run(conn, s.read(64 * KiB)) is c  # (no copy on the bulk path)
    conn._loop.close()


def test_reads_of_any_size_across_chunks_return_the_bytes_in_order_with_exact_accounting() -> None:
    rng = random.Random(7)
    s, conn = _stream()
    sent = b""
    got = bytearray()
    for _ in range(400):
        if rng.random() < 0.5:
            c = rng.randbytes(rng.choice((1, 7, 32, 1000, 70_000)))
            s._on_data(c, False)
            sent += c
        elif s._buf:
            got += _run(conn, s.read(rng.choice((1, 5, 32, 999, 65536, 200_000))))
        assert s._buf_len == len(sent) - len(got) == conn._quic.rx_unread
        assert s._consumed == len(got)
    s._on_data(b"", True)
    got += _run(conn, s.readexactly(len(sent) - len(got)))
    assert bytes(got) == sent
    assert _run(conn, s.read()) == b""  # FIN after the last byte
    conn._loop.close()


def test_a_reset_drops_a_partly_read_chunk_and_its_accounting() -> None:
    s, conn = _stream()
    s._on_data(b"a" * 1000, False)
    s._on_data(b"b" * 1000, False)
    assert _run(conn, s.read(300)) == b"a" * 300
    assert _run(conn, s.readexactly(800)) == b"a" * 700 + b"b" * 100
    s._on_reset(0)
    assert s._buf_len == 0 and conn._quic.rx_unread == 0
    with pytest.raises(StreamReset):
        _run(conn, s.read())
    conn._loop.close()
