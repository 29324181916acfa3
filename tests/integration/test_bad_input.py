"""What a hostile or broken peer can send a node over TCP, and what happens: the offending
connection or stream is closed, the node keeps serving everyone else, memory stays bounded."""

import asyncio
import os
import time

import pytest

import lattica
from lattica.errors import StreamReset
from lattica.transports.mux import F_SYN, FRAME_HEADER, T_DATA, T_WINDOW, MuxConfig
from lattica.transports.noise import NoiseHandshake
from lattica.transports.tcp import TcpTransport

HDR = FRAME_HEADER
ECHO = "/test/echo/1"


async def _echo(stream, conn):
    while data := await stream.read():
        stream.write(data)
        await stream.drain()
    await stream.close()


@pytest.fixture
def server():
    node = lattica.Node(
        ["/ip4/127.0.0.1/tcp/0"],
        transport_options={"tcp": {"handshake_timeout": 1.0, "mux_config": MuxConfig(max_streams=8)}},
    )
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
    except TimeoutError:
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


@pytest.mark.parametrize(
    "garbage", [os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\xff\xff" + os.urandom(100)]
)
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


def test_oversized_identify_closes_the_connection(server):
    """Identify is mandatory: one that claims more than its 64 KiB cap drops the connection
    (the length is checked before anything is read or allocated)."""
    with lattica.Node([]) as probe:
        probe.connect(server.addrs[0])

        async def send_big():
            conn = await probe._host.get_connection(server.peer_id)
            s = await conn.open_stream()
            s.write(b"\x11/lattica/id/1.0.0" + (10 * 2**20).to_bytes(4, "big"))  # "10 MiB follow"
            try:
                await asyncio.wait_for(s.read(), 5)
            except Exception as e:
                return type(e).__name__
            return "no error"

        assert probe.run(send_big()) == "ConnectionClosed"
    still_serves(server)


def test_oversized_message_on_a_service_resets_only_that_stream(server):
    """A service reading capped messages gets FrameTooLarge; the node resets that stream and the
    connection carries on (same connection object, still pinging)."""
    from lattica._framing import read_message

    async def capped(stream, conn):
        await read_message(stream, max_size=1024)

    server.set_stream_handler("/test/capped/1", capped)
    with lattica.Node([]) as probe:
        probe.connect(server.addrs[0])

        async def send_big():
            conn = await probe._host.get_connection(server.peer_id)
            s = await probe.aopen_stream(server.peer_id, "/test/capped/1")
            s.write((1 << 20).to_bytes(4, "big"))
            with pytest.raises(StreamReset):
                await asyncio.wait_for(s.read(), 5)
            return conn

        conn = probe.run(send_big())
        assert probe.ping(server.peer_id) > 0
        assert probe.run(probe._host.get_connection(server.peer_id)) is conn


def test_logged_reasons(server, caplog):
    """Each refusal is logged with its reason (the node's loggers feed stdlib logging)."""
    import logging

    caplog.set_level(logging.INFO, logger="lattica")

    async def garbage():
        reader, writer = await asyncio.open_connection(*_hostport(server))
        writer.write(os.urandom(300))
        await _closed_by_peer(reader)

    asyncio.run(garbage())

    async def bad_frame():
        reader, writer, session = await _raw_secure(*_hostport(server))
        writer.write(session.seal(HDR.pack(7, T_DATA, 0, 1, 0)))
        await _closed_by_peer(reader)

    asyncio.run(bad_frame())
    time.sleep(0.2)
    messages = [r.getMessage() for r in caplog.records]
    assert any("inbound handshake failed" in m for m in messages), messages
    assert any("peer broke the protocol" in m for m in messages), messages


def test_handshake_flood_is_capped():
    """Sockets that connect and never finish a handshake hold at most max_pending_handshakes
    slots; beyond that they are dropped at once, and a real peer gets in when slots free up."""
    opts = {"tcp": {"max_pending_handshakes": 16, "handshake_timeout": 1.0}}
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options=opts) as node:
        node.set_stream_handler(ECHO, _echo)

        async def flood():
            socks = [await asyncio.open_connection(*_hostport(node)) for _ in range(40)]
            closed = await asyncio.gather(*(_closed_by_peer(r, timeout=0.5) for r, _ in socks))
            for _, w in socks:
                w.close()
            return sum(closed)

        dropped_at_once = asyncio.run(flood())
        assert dropped_at_once == 40 - 16
        time.sleep(1.2)  # the 16 stalled handshakes time out and free their slots
        still_serves(node)


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
            except TimeoutError:
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
            except TimeoutError:
                pass
            return pushed

        pushed = probe.run(flood(), timeout=60)
        window = MuxConfig().window
        assert pushed < 64 * 2**20, "the writer was never pushed back"
        assert server.run(_server_buffers(server._host)) <= (window, window)
        still_serves(server)


async def _server_buffers(h):
    """(largest unread bytes on a connection, largest unsent bytes of one stream)."""
    unread = max(c._mux._buffered_total for c in h.all_conns)
    unsent = max((s._pending_bytes for c in h.all_conns for s in c._streams.values()), default=0)
    return unread, unsent


def test_ping_flood_without_reading_is_bounded(server):
    """The built-in ping service: a peer that sends pings and never reads the echoes cannot make
    the node queue echoes without limit."""

    async def flood():
        t = TcpTransport(lattica.KeyPair.generate())
        conn = await t.dial(server.addrs[0])
        s = await conn.open_stream()
        s.write(b"\x10/ipfs/ping/1.0.0")
        ping = os.urandom(32) * 32768  # 1 MiB of pings per write
        pushed = 0
        try:
            for _ in range(128):
                s.write(ping)
                await asyncio.wait_for(s.drain(), 2.0)
                pushed += len(ping)
        except TimeoutError:
            pass
        unread, unsent = server.run(_server_buffers(server._host))
        await t.close()
        return pushed, unread, unsent

    pushed, unread, unsent = asyncio.run(flood())
    window = MuxConfig().window
    assert pushed < 64 * 2**20, "the pinger was never pushed back"
    assert unread <= window and unsent <= window
    still_serves(server)


def test_silent_peer_is_dropped_by_keepalive_but_live_idle_peer_is_kept():
    opts = {"tcp": {"keepalive_interval": 0.2, "keepalive_timeout": 0.8}}
    with (
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options=opts) as node,
        lattica.Node([], transport_options=opts) as live,
    ):
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
