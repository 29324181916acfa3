"""The receive-window rule of a QUIC stream (transports/quic/stream.py ``QuicStream._tune``),
driven with a clock and a round trip we choose."""

from __future__ import annotations

from lattica.transports.quic.connection import QuicConn
from lattica.transports.quic.stream import QuicStream

KiB, MiB = 1024, 1024 * 1024


class _Quic:
    def __init__(self) -> None:
        self.rtt = 0.010
        self.rx_unread = 0
        self.rx_stream_limit: dict[int, int] = {}
        self.conn_window = 1 * MiB

    def smoothed_rtt(self) -> float:
        return self.rtt

    def set_connection_window(self, window: int) -> None:
        self.conn_window = max(window, 1 * MiB)  # (max_data: 1 MiB here)

    def conn_credit_due(self) -> bool:
        return False


class _Loop:
    now = 100.0

    def time(self) -> float:
        return self.now


class _Conn:
    def __init__(self, window: int, max_window: int) -> None:
        self._quic = _Quic()
        self._loop = _Loop()
        self._stream_window = window
        self._max_window = max_window
        self._streams: dict[int, QuicStream] = {}
        self._wide = True  # (a trusted peer's connection: its window follows its streams')
        self.flushes = 0

    _windows_changed = QuicConn._windows_changed  # (the real rule: 1.5x the largest stream window)

    def _schedule_flush(self) -> None:
        self.flushes += 1


def _read(s: QuicStream, conn: _Conn, n: int, seconds: float) -> None:
    """The application reads ``n`` bytes, spread over ``seconds``."""
    step = 64 * KiB
    for _ in range(n // step):
        conn._loop.now += seconds * step / n
        s._on_data(b"x" * step, False)
        s._take(step)


def test_a_window_read_each_round_trip_doubles_once_a_round_trip_up_to_the_bound() -> None:
    conn = _Conn(256 * KiB, 2 * MiB)
    s = conn._streams[0] = QuicStream(conn, 0, outbound=False)  # type: ignore[arg-type]
    sizes = []
    for _ in range(12):  # the peer sends a whole window per round trip
        _read(s, conn, s._window, conn._quic.rtt)
        sizes.append(s._window)
    assert sizes[0] > 256 * KiB and sizes[-1] == 2 * MiB
    assert all(b in (a, 2 * a) for a, b in zip(sizes, sizes[1:]))
    assert conn._quic.conn_window == 3 * MiB  # 1.5x the largest stream window
    credit = conn._quic.rx_stream_limit[0] - s._consumed  # read + window at the last update
    assert 2 * MiB * 3 // 4 < credit <= 2 * MiB


def test_a_slow_reader_brings_the_window_back_to_the_configured_one() -> None:
    conn = _Conn(256 * KiB, 2 * MiB)
    s = conn._streams[0] = QuicStream(conn, 0, outbound=False)  # type: ignore[arg-type]
    for _ in range(12):
        _read(s, conn, s._window, conn._quic.rtt)
    assert s._window == 2 * MiB and conn._quic.conn_window == 3 * MiB
    for _ in range(12):  # a quarter window now takes many round trips
        _read(s, conn, s._window, 40 * conn._quic.rtt)
    assert s._window == 256 * KiB
    assert conn._quic.conn_window == 1 * MiB  # the connection's window came back down too
    advertised = s._advertised
    assert conn._quic.rx_stream_limit[0] == advertised  # credit already granted is never taken back
    assert advertised >= s._consumed + 256 * KiB


def test_no_round_trip_measured_or_a_fixed_bound_keeps_the_window() -> None:
    conn = _Conn(256 * KiB, 256 * KiB)
    s = QuicStream(conn, 0, outbound=False)  # type: ignore[arg-type]
    for _ in range(8):
        _read(s, conn, s._window, 0.0001)
    assert s._window == 256 * KiB
    conn = _Conn(256 * KiB, 2 * MiB)
    conn._quic.rtt = 0.0
    s = QuicStream(conn, 0, outbound=False)  # type: ignore[arg-type]
    for _ in range(8):
        _read(s, conn, s._window, 0.0001)
    assert s._window == 256 * KiB and conn._quic.conn_window == 1 * MiB
