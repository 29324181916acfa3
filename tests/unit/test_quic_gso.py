"""The QUIC endpoint's sending: runs of equal-size datagrams to one address leave as UDP GSO
sends, in order, and a kernel that refuses GSO (or a full socket buffer) gets them one by one."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

from lattica.transports.quic.endpoint import Endpoint
from lattica.transports.quic.wire import GSO_SEGMENTS

A = ("127.0.0.1", 4001)
B = ("127.0.0.1", 4002)


class _Sock:
    """A UDP socket whose sendmsg is recorded (or fails with ``error``)."""

    def __init__(self, real: socket.socket, error: OSError | None = None) -> None:
        self._real = real
        self.error = error
        self.runs: list[tuple[bytes, int, tuple]] = []

    def sendmsg(self, buffers: list[bytes], ancdata: list[tuple[int, int, bytes]], flags: int, addr: tuple) -> int:
        if self.error is not None:
            raise self.error
        ((level, kind, data),) = ancdata
        assert level == socket.SOL_UDP
        self.runs.append((b"".join(buffers), int.from_bytes(data, "little"), addr))
        return sum(len(b) for b in buffers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Transport:
    """What the endpoint's asyncio transport is told to send one by one."""

    def __init__(self, buffered: int = 0) -> None:
        self.sent: list[tuple[bytes, tuple]] = []
        self.buffered = buffered

    def sendto(self, data: bytes, addr: tuple) -> None:
        self.sent.append((data, addr))

    def get_write_buffer_size(self) -> int:
        return self.buffered


def _endpoint(error: OSError | None = None, buffered: int = 0) -> tuple[Endpoint, _Sock, _Transport]:
    real = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    real.bind(("127.0.0.1", 0))
    ep = Endpoint(None, real)  # type: ignore[arg-type]  # (the owner is not used for sending)
    sock, tr = _Sock(real, error), _Transport(buffered)
    ep.sock, ep.dgram = sock, tr  # type: ignore[assignment]
    return ep, sock, tr


def _datagrams() -> list[tuple[bytes, tuple]]:
    out = [(bytes([i]) * 1350, A) for i in range(50)]  # more than one GSO send holds
    out.append((b"s" * 700, A))  # a short one ends a run
    out += [(bytes([100 + i]) * 1350, A) for i in range(3)]
    out += [(b"b" * 1350, B), (b"c" * 1350, B), (b"d" * 9, B)]
    return out


def test_runs_of_equal_datagrams_leave_as_gso_sends_in_order() -> None:
    async def main() -> None:
        ep, sock, tr = _endpoint()
        datagrams = _datagrams()
        assert ep.send_datagrams(datagrams) == sum(len(d) for d, _ in datagrams)
        first = 65000 // 1350  # (a GSO send stays under a UDP datagram's 65,000 here)
        assert first <= GSO_SEGMENTS
        assert len(sock.runs[0][0]) == first * 1350
        assert [(size, addr) for _, size, addr in sock.runs] == [(1350, A), (1350, A), (1350, A), (1350, B)]
        assert tr.sent == []  # (every run had more than one datagram)
        # the bytes leave in the order they were made, each run cut at its segment size
        assert b"".join(data for data, _, _ in sock.runs) == b"".join(d for d, _ in datagrams)
        assert len(sock.runs[1][0]) == (50 - first) * 1350 + 700
        assert ep.gso_sends == 4

    asyncio.run(main())


def test_a_lone_datagram_goes_through_the_transport() -> None:
    async def main() -> None:
        ep, sock, tr = _endpoint()
        ep.send_datagrams([(b"x" * 1350, A), (b"y" * 1350, B)])
        assert sock.runs == [] and tr.sent == [(b"x" * 1350, A), (b"y" * 1350, B)]

    asyncio.run(main())


def test_a_kernel_that_refuses_gso_gets_the_datagrams_one_by_one_from_then_on() -> None:
    async def main() -> None:
        ep, sock, tr = _endpoint(OSError(errno.EIO, "no checksum offload"))
        datagrams = _datagrams()
        ep.send_datagrams(datagrams)
        assert ep.gso is False and ep.gso_sends == 0
        assert tr.sent == datagrams

    asyncio.run(main())


def test_a_full_socket_buffer_queues_the_run_in_the_transport_and_later_runs_queue_behind_it() -> None:
    async def main() -> None:
        ep, sock, tr = _endpoint(BlockingIOError(errno.EAGAIN, "full"))
        datagrams = _datagrams()
        ep.send_datagrams(datagrams)
        assert tr.sent == datagrams and ep.gso  # (a full buffer is no refusal)
        ep2, sock2, tr2 = _endpoint(buffered=4096)  # the transport still holds datagrams: in order behind them
        ep2.send_datagrams(datagrams)
        assert sock2.runs == [] and tr2.sent == datagrams

    asyncio.run(main())


def test_a_send_error_is_reported_like_the_transports_and_the_run_dropped() -> None:
    async def main() -> None:
        ep, sock, tr = _endpoint(OSError(errno.ECONNREFUSED, "refused"))
        seen: list[Exception] = []
        ep.error_received = seen.append  # type: ignore[method-assign]
        ep.send_datagrams([(b"x" * 1350, A), (b"y" * 1350, A)])
        assert [e.errno for e in seen] == [errno.ECONNREFUSED]  # type: ignore[attr-defined]
        assert ep.gso and tr.sent == []

    asyncio.run(main())
