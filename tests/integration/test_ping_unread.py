"""A pinger that never takes its echoes (lattica/_ping.py ``serve``): the node stops reading its
pings and resets the stream within DRAIN_TIMEOUT, so the unread pings it pinned are let go; the
connection and honest pings carry on."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import lattica
from lattica import _ping as ping
from lattica.errors import StreamReset
from lattica.transports.base import Stream
from lattica.transports.mux import MuxConfig

KiB = 1024
TCP = "/ip4/127.0.0.1/tcp/0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
# the pinger grants little credit for echoes; the node's QUIC high-water mark is lowered from 1 MiB
# so that a few thousand pings stall it (over TCP it stalls once the pinger's 256 KiB are spent)
PINGER = {
    "quic": {"max_stream_data": 16 * KiB, "max_data": 64 * KiB},
    "tcp": {"mux_config": MuxConfig(window=256 * KiB, max_window=256 * KiB)},
}


@pytest.mark.parametrize("listen", [TCP, QUIC])
def test_a_pinger_that_does_not_read_its_echoes_gets_its_stream_reset(listen, monkeypatch):
    monkeypatch.setattr(ping, "DRAIN_TIMEOUT", 1.0)
    node = lattica.Node([listen], transport_options={"quic": {"send_high_water": 16 * KiB}})
    with node, lattica.Node([], transport_options=PINGER) as pinger:
        pinger.connect(node.addrs[0])

        async def flood() -> tuple[float, float]:
            s = await pinger.aopen_stream(node.peer_id, ping.PROTOCOL)
            s.write(os.urandom(32 * 16384))  # 512 KiB of pings; no echo is ever read
            sent_at = time.monotonic()
            while time.monotonic() - sent_at < 15.0:
                await asyncio.sleep(0.05)
                try:
                    s.write(os.urandom(32))  # (and one more now and then)
                except StreamReset:
                    return sent_at, time.monotonic()
            return sent_at, float("inf")

        sent_at, reset_at = pinger.run(flood(), timeout=30)
        assert 0.9 < reset_at - sent_at < 1.0 + 5.0  # DRAIN_TIMEOUT, and a loaded machine's slack
        assert pinger.ping(node.peer_id) > 0  # the same connection still pings honestly
        with lattica.Node([]) as honest:
            honest.connect(node.addrs[0])
            assert honest.ping(node.peer_id, count=20) > 0


class _Trickle(Stream):
    """A ping stream whose peer pipelines pings and takes an echo now and then: drain() returns
    every 0.1 s, but the echoes it has not taken stay far above the backlog mark."""

    def __init__(self) -> None:
        self.unsent = 0
        self.was_reset = asyncio.Event()

    async def read(self, max_bytes: int = 65536) -> bytes:
        return bytes(32)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.unsent += len(data)

    async def drain(self) -> None:
        if self.unsent > 64 * KiB:
            await asyncio.sleep(0.1)
            self.unsent -= 32

    def write_buffer_size(self) -> int:
        return self.unsent

    async def close(self) -> None:
        pass

    def reset(self) -> None:
        self.was_reset.set()


def test_a_trickle_of_taken_echoes_does_not_restart_the_clock(monkeypatch):
    monkeypatch.setattr(ping, "DRAIN_TIMEOUT", 1.0)

    async def main() -> float:
        s = _Trickle()
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(ping.serve(s), 10)
        assert s.was_reset.is_set()
        return asyncio.get_running_loop().time() - t0

    assert asyncio.run(main()) < 1.0 + 1.0
