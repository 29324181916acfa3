"""What a hostile or broken peer can send a node over TCP, and what happens: the offending
connection or stream is closed, the node keeps serving everyone else, memory stays bounded."""

import asyncio
import os
import struct
import time

import pytest

import lattica
from lattica.errors import StreamReset
from lattica.transports.mux import F_SYN, T_DATA, T_WINDOW, MuxConfig
from lattica.transports.noise import NoiseHandshake
from lattica.transports.tcp import TcpTransport

HDR = struct.Struct(">BBHII")
ECHO = "/test/echo/1"


async def _echo(stream, conn):
    while data := await stream.read():
        stream.write(data)
        await stream.drain()
    await stream.close()


@pytest.fixture
def server():
    node = lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options={"tcp": {"handshake_timeout": 1.0, "mux_config": MuxConfig(max_streams=8)}})
    node.start()
    node.set_stream_handler(ECHO, _echo)
    yield node
    node.stop()


def still_serves(node):
    """A fresh, well-behaved peer can connect, ping and use a protocol."""
    with lattica.Node([]) as probe:
        probe.connect(node.addrs[0])
        assert probe.ping(node.peer_id) > 0

        async def echo():
            s = await probe.aopen_stream(node.peer_id, ECHO)
            s.write(b"still here")
            await s.close()
            return await s.read()

        assert probe.run(echo()) == b"still here"


async def _closed_by_peer(reader, timeout=5.0):
    """True if the server closes the socket (EOF or reset) within ``timeout``."""
    try:
        while True:
            if not await asyncio.wait_for(reader.read(65536), timeout):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except asyncio.TimeoutError:
        return False


async def _raw_secure(host, port, keypair=None, record=None):
    """Complete a Noise handshake by hand; return (reader, writer, session)."""
    reader, writer = await asyncio.open_connection(host, port)
    hs = NoiseHandshake(keypair or lattica.KeyPair.generate(), True)
    first = hs.start()
    writer.write(first)
    sent = [first]
    while not hs.complete:
        data = await reader.read(65536)
        assert data, "server closed during handshake"
        out = hs.receive(data)
        if out:
            writer.write(out)
            sent.append(out)
    if record is not None:
        record.extend(sent)
    return reader, writer, hs.session


def _hostport(node):
    return node.addrs[0].without_peer_id().host_port()


@pytest.mark.parametrize("garbage", [os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\xff\xff" + os.urandom(100)])
def test_garbage_before_handshake(server, garbage):
    async def main():
        reader, writer = await asyncio.open_connection(*_hostport(server))
        writer.write(garbage)
        return await _closed_by_peer(reader)

    assert asyncio.run(main())
    still_serves(server)


def test_truncated_handshake_times_out(server):
    async def main():
        reader, writer = await asyncio.open_connection(*_hostport(server))
        hs = NoiseHandshake(lattica.KeyPair.generate(), True)
        writer.write(hs.start()[:20])  # half of the first message, then silence
        t0 = time.monotonic()
        closed = await _closed_by_peer(reader, timeout=5)
        return closed, time.monotonic() - t0

    closed, waited = asyncio.run(main())
    assert closed and waited < 4  # handshake_timeout is 1 s
    still_serves(server)


def test_replayed_handshake_is_rejected(server):
    kp = lattica.KeyPair.generate()

    async def main():
        sent = []
        _, w, _ = await _raw_secure(*_hostport(server), keypair=kp, record=sent)
        w.close()
        # replay the recorded first and third messages on a new socket
        reader, writer = await asyncio.open_connection(*_hostport(server))
        writer.write(sent[0])
        await reader.read(65536)  # the server's fresh second message
        writer.write(sent[1])
        return await _closed_by_peer(reader)

    assert asyncio.run(main())
    time.sleep(0.2)
    assert kp.peer_id not in [p.peer_id for p in server.peers()]
    still_serves(server)


@pytest.mark.parametrize(
    "frame",
    [
        HDR.pack(7, T_DATA, 0, 1, 0),  # unknown version
        HDR.pack(0, 9, 0, 1, 0),  # unknown frame type
        HDR.pack(0, T_DATA, F_SYN, 1, 2**31),  # declared length beyond any window
        HDR.pack(0, T_WINDOW, F_SYN, 2, 0),  # stream id of the wrong parity
    ],
    ids=["version", "type", "oversized", "parity"],
)
def test_malformed_mux_frames_close_the_connection(server, frame):
    async def main():
        reader, writer, session = await _raw_secure(*_hostport(server))
        writer.write(session.seal(frame))
        return await _closed_by_peer(reader)

    assert asyncio.run(main())
    still_serves(server)


def test_tampered_ciphertext_closes_the_connection(server):
    async def main():
        reader, writer, session = await _raw_secure(*_hostport(server))
        sealed = bytearray(session.seal(HDR.pack(0, T_WINDOW, F_SYN, 1, 0)))
        sealed[-1] ^= 0x40
        writer.write(sealed)
        return await _closed_by_peer(reader)

    assert asyncio.run(main())
    still_serves(server)


def test_oversized_message_resets_the_stream_only(server):
    """An identify message larger than the 64 KiB cap is refused; the connection itself is dropped
    (identify is mandatory), and nothing is buffered beyond the cap."""
    with lattica.Node([]) as probe:
        probe.connect(server.addrs[0])

        async def send_big():
            conn = await probe._host.get_connection(server.peer_id)
            s = await conn.open_stream()
            s.write(b"\x11/lattica/id/1.0.0")
            s.write((10 * 2**20).to_bytes(4, "big"))  # claims a 10 MiB identify message
            await s.drain()
            try:
                await asyncio.wait_for(s.read(), 5)
            except Exception as e:
                return type(e).__name__
            return "no error"

        result = probe.run(send_big())
        assert result in ("ConnectionClosed", "StreamReset")
    still_serves(server)


def test_streams_beyond_the_limit_are_refused(server):
    """The server allows 8 streams per connection. Its own identify push takes one slot if it is
    opened before our SYNs arrive (this raw client never reads it), so of 12 streams we open
    7 or 8 are accepted and the rest reset; the connection lives either way."""

    async def main():
        t = TcpTransport(lattica.KeyPair.generate())
        conn = await t.dial(server.addrs[0])
        streams = [await conn.open_stream() for _ in range(12)]

        async def outcome(s):
            try:
                await asyncio.wait_for(s.read(), 1.0)
            except StreamReset:
                return "reset"
            except asyncio.TimeoutError:
                return "open"
            return "data"

        results = await asyncio.gather(*(outcome(s) for s in streams))
        alive = not conn.is_closed
        await t.close()
        return results, alive

    results, alive = asyncio.run(main())
    assert alive
    assert results.count("reset") in (4, 5), results
    assert results.count("open") == 12 - results.count("reset"), results
    still_serves(server)


def test_peer_that_stops_reading_is_bounded(server):
    """A client pushes into an echo stream but never reads the echoes: the server's writer stalls
    on credit, the client's writer stalls in turn, and the server's buffers stay under its window."""
    with lattica.Node([]) as probe:
        probe.connect(server.addrs[0])

        async def flood():
            s = await probe.aopen_stream(server.peer_id, ECHO)
            block = os.urandom(1 << 20)
            pushed = 0
            try:
                for _ in range(256):
                    s.write(block)
                    await asyncio.wait_for(s.drain(), 2.0)
                    pushed += len(block)
            except asyncio.TimeoutError:
                pass
            return pushed

        pushed = probe.run(flood(), timeout=60)

        async def server_buffered(h):
            return max(c._mux._buffered_total for c in h.all_conns)

        window = MuxConfig().window
        assert pushed < 64 * 2**20, "the writer was never pushed back"
        assert server.run(server_buffered(server._host)) <= window
        still_serves(server)


def test_silent_peer_is_dropped_by_keepalive_but_live_idle_peer_is_kept():
    opts = {"tcp": {"keepalive_interval": 0.2, "keepalive_timeout": 0.8}}
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options=opts) as node, lattica.Node([], transport_options=opts) as live:
        live.connect(node.addrs[0])

        async def silent():
            reader, writer, _ = await _raw_secure(*_hostport(node))  # never answers mux pings
            t0 = time.monotonic()
            closed = await _closed_by_peer(reader, timeout=5)
            return closed, time.monotonic() - t0

        closed, waited = asyncio.run(silent())
        assert closed and 0.5 < waited < 3
        time.sleep(1.0)  # well past the keepalive timeout: the answering peer is still connected
        assert [p.peer_id for p in node.peers()] == [live.peer_id]
