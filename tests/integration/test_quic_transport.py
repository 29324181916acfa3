"""QUIC transport on loopback: handshake, identity, streams, limits, close, junk, two processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from helpers import end_child
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.errors import (
    ConnectionClosed,
    HandshakeError,
    PeerIdMismatch,
    StreamClosed,
    StreamLimit,
    StreamReset,
    Timeout,
    TransportError,
)
from lattica.transports.base import Connection, Stream
from lattica.transports.quic import QuicConn, QuicTransport
from lattica.transports.quic._aioquic import LatticaQuicConnection

LOCAL4 = Multiaddr("/ip4/127.0.0.1/udp/0/quic-v1")


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 30.0) -> None:
    """Run one test coroutine on a fresh loop, with a hard deadline."""

    async def main() -> None:
        await asyncio.wait_for(coro_fn(), timeout)

    asyncio.run(main())


class Pair:
    """Two transports, B listening, A connected to B; ``server`` is B's side of the connection."""

    ta: QuicTransport
    tb: QuicTransport
    client: QuicConn
    server: QuicConn
    inbound: list[Connection]
    addr: Multiaddr


@asynccontextmanager
async def pair(**kw: object) -> AsyncIterator[Pair]:
    p = Pair()
    p.ta, p.tb = QuicTransport(KeyPair.generate(), **kw), QuicTransport(KeyPair.generate(), **kw)
    p.inbound = []
    got: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    def on_conn(c: Connection) -> None:
        p.inbound.append(c)
        if not got.done():
            got.set_result(c)

    listener = await p.tb.listen(LOCAL4, on_conn)
    p.addr = listener.addrs[0]
    try:
        p.client = await p.ta.dial(p.addr, p.tb.keypair.peer_id)  # type: ignore[assignment]
        p.server = await asyncio.wait_for(got, 5)  # type: ignore[assignment]
        yield p
    finally:
        await p.ta.close()
        await p.tb.close()


async def echo(s: Stream) -> None:
    try:
        while True:
            data = await s.read()
            if not data:
                break
            s.write(data)
            await s.drain()
        await s.close()
    except (StreamReset, ConnectionClosed):
        pass


def serve_echo(conn: Connection) -> list[asyncio.Task[None]]:
    tasks: list[asyncio.Task[None]] = []
    conn.set_stream_handler(lambda s: tasks.append(asyncio.ensure_future(echo(s))))
    return tasks


async def read_all(s: Stream) -> bytes:
    parts = []
    while True:
        data = await s.read(1 << 20)
        if not data:
            return b"".join(parts)
        parts.append(data)


# -- handshake and identity ---------------------------------------------------------------------


def test_dial_both_sides_see_each_others_peer_id() -> None:
    async def main() -> None:
        async with pair() as p:
            assert p.client.remote_peer == p.tb.keypair.peer_id
            assert p.client.local_peer == p.ta.keypair.peer_id
            assert p.server.remote_peer == p.ta.keypair.peer_id
            assert p.server.local_peer == p.tb.keypair.peer_id
            assert (p.client.transport, p.client.direction) == ("quic", "outbound")
            assert (p.server.transport, p.server.direction) == ("quic", "inbound")
            assert p.client.remote_addr == p.addr
            assert p.server.local_addr == p.addr
            assert p.server.remote_addr.protocols() == ["ip4", "udp", "quic-v1"]
            assert not p.client.is_closed and not p.server.is_closed

    run(main)


def test_handles_only_quic_addresses() -> None:
    t = QuicTransport(KeyPair.generate())
    pid = KeyPair.generate().peer_id
    assert t.handles(Multiaddr("/ip4/1.2.3.4/udp/4001/quic-v1"))
    assert t.handles(Multiaddr(f"/ip6/::1/udp/4001/quic-v1/p2p/{pid}"))
    assert not t.handles(Multiaddr("/ip4/1.2.3.4/tcp/4001"))
    assert not t.handles(Multiaddr("/ip4/1.2.3.4/udp/4001"))
    assert not t.handles(Multiaddr("/dns4/example.com/udp/4001/quic-v1"))


def test_dial_takes_peer_id_from_address() -> None:
    async def main() -> None:
        async with pair() as p:
            wrong = KeyPair.generate().peer_id
            with pytest.raises(PeerIdMismatch):
                await p.ta.dial(p.addr.with_peer_id(wrong))
            conn = await p.ta.dial(p.addr.with_peer_id(p.tb.keypair.peer_id))
            assert conn.remote_peer == p.tb.keypair.peer_id

    run(main)


def test_wrong_expected_peer_id_fails_dial_and_listener_sees_nothing() -> None:
    async def main() -> None:
        async with pair() as p:
            before = list(p.inbound)
            with pytest.raises(PeerIdMismatch):
                await p.ta.dial(p.addr, KeyPair.generate().peer_id)
            ep = next(iter(p.tb._listen_eps))
            for _ in range(50):  # the half-open server side drains for 3 PTO, then goes away
                if ep.pending == 0:
                    break
                await asyncio.sleep(0.1)
            assert p.inbound == before  # the listener never completed that handshake
            assert ep.pending == 0
            assert ep.members == {p.server}

    run(main)


def test_listener_rejects_client_with_bad_certificate() -> None:
    """Mutual auth: a client whose certificate does not prove its key is never handed over."""

    async def main() -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        from lattica.transports.quic import tlscert

        async with pair() as p:
            mallory = QuicTransport(KeyPair.generate())
            real = tlscert.generate_certificate(mallory.keypair)
            other = KeyPair.generate()
            key = ec.generate_private_key(ec.SECP256R1())
            spki = tlscert._spki(key.public_key())
            forged = tlscert.build_certificate(  # claims mallory's key, signed by someone else
                key,
                tlscert.encode_signed_key(
                    mallory.keypair.public_key_protobuf(),
                    other.sign(tlscert.SIGNATURE_PREFIX + spki),
                ),
                not_before=real.certificate.not_valid_before_utc,
                not_after=real.certificate.not_valid_after_utc,
            )
            mallory._cert = tlscert.CertifiedKey(key, forged)
            before = list(p.inbound)
            try:
                try:
                    conn = await mallory.dial(p.addr, p.tb.keypair.peer_id)
                except (HandshakeError, TransportError):
                    pass  # the server's rejection may beat the client's handshake completion
                else:
                    # TLS 1.3: the client finishes first; the server's close follows
                    await asyncio.wait_for(conn.wait_closed(), 5)
                    assert conn.is_closed
                await asyncio.sleep(0.2)
                assert p.inbound == before
            finally:
                await mallory.close()

    run(main)


def test_handshake_timeout() -> None:
    async def main() -> None:
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        t = QuicTransport(KeyPair.generate(), handshake_timeout=0.5)
        try:
            t0 = time.monotonic()
            with pytest.raises(Timeout):
                await t.dial(Multiaddr(f"/ip4/127.0.0.1/udp/{port}/quic-v1"))
            assert time.monotonic() - t0 < 3
            assert not t._conns
        finally:
            silent.close()
            await t.close()

    run(main)


def test_connection_refused_is_a_transport_error() -> None:
    """ICMP port unreachable (seen through IP_RECVERR) fails the dial fast, not by timeout."""

    async def main() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        t = QuicTransport(KeyPair.generate(), handshake_timeout=5)
        other = QuicTransport(KeyPair.generate())
        try:
            t0 = time.monotonic()
            with pytest.raises(TransportError):
                await t.dial(Multiaddr(f"/ip4/127.0.0.1/udp/{port}/quic-v1"))
            assert time.monotonic() - t0 < 2
            # same from a listening (shared) socket
            await other.listen(LOCAL4, lambda c: None)
            with pytest.raises(TransportError):
                await other.dial(Multiaddr(f"/ip4/127.0.0.1/udp/{port}/quic-v1"))
        finally:
            await t.close()
            await other.close()

    run(main)


# -- the shared UDP socket ----------------------------------------------------------------------


def test_dial_goes_out_from_the_listening_socket() -> None:
    async def main() -> None:
        ka, kb = KeyPair.generate(), KeyPair.generate()
        ta, tb = QuicTransport(ka), QuicTransport(kb)
        seen: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        try:
            la = await ta.listen(LOCAL4, lambda c: None)
            lb = await tb.listen(LOCAL4, seen.set_result)
            conn = await ta.dial(lb.addrs[0], kb.peer_id)
            inbound = await asyncio.wait_for(seen, 5)
            a_port = la.addrs[0].host_port()[1]
            assert inbound.remote_addr.host_port()[1] == a_port
            assert conn.local_addr == la.addrs[0]
            assert not ta._ephemeral  # no extra socket was opened
        finally:
            await ta.close()
            await tb.close()

    run(main)


def test_dial_without_listener_uses_one_ephemeral_socket() -> None:
    async def main() -> None:
        async with pair() as p:
            second = await p.ta.dial(p.addr, p.tb.keypair.peer_id)
            assert second.local_addr == p.client.local_addr  # shared ephemeral endpoint
            assert len(p.ta._endpoints) == 1

    run(main)


def test_simultaneous_dials_between_two_listeners() -> None:
    """Both sides dial each other from their listening sockets at once (hole-punch shape)."""

    async def main() -> None:
        ka, kb = KeyPair.generate(), KeyPair.generate()
        ta, tb = QuicTransport(ka), QuicTransport(kb)
        try:
            la = await ta.listen(LOCAL4, serve_echo)
            lb = await tb.listen(LOCAL4, serve_echo)
            ca, cb = await asyncio.gather(ta.dial(lb.addrs[0], kb.peer_id), tb.dial(la.addrs[0], ka.peer_id))
            for c in (ca, cb):
                s = await c.open_stream()
                s.write(b"ping")
                await s.close()
                assert await read_all(s) == b"ping"
        finally:
            await ta.close()
            await tb.close()

    run(main)


def test_junk_datagrams_never_break_the_listener() -> None:
    async def main() -> None:
        async with pair() as p:
            serve_echo(p.server)
            host, port = p.addr.host_port()
            junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # a genuine Initial to mutate: capture one from a dial towards a plain socket
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sink.bind(("127.0.0.1", 0))
            sink.settimeout(5)
            probe = QuicTransport(KeyPair.generate(), handshake_timeout=0.3)
            dial = asyncio.ensure_future(probe.dial(Multiaddr(f"/ip4/127.0.0.1/udp/{sink.getsockname()[1]}/quic-v1")))
            initial = await asyncio.get_running_loop().run_in_executor(None, lambda: sink.recvfrom(65535)[0])
            with pytest.raises(Timeout):
                await dial
            await probe.close()
            sink.close()
            assert initial[0] & 0xC0 == 0xC0 and len(initial) >= 1200
            rnd = os.urandom
            datagrams = [
                b"",
                b"\x00",
                b"\xff",
                rnd(1),
                rnd(20),
                rnd(1200),
                rnd(1500),
                b"\x40" + rnd(8) + rnd(100),  # short header, unknown CID
                b"\xc0\x00\x00\x00\x01\x08" + rnd(8),  # long header, truncated
                b"\xc0\x00\x00\x00\x01\xff" + rnd(40),  # CID length too long
                b"\xc0\xba\xba\xba\xba\x08" + rnd(8) + b"\x00" + rnd(1200),  # unknown version
                initial[:50],  # truncated Initial
                initial[:1199],
                initial[:30] + rnd(len(initial) - 30),  # garbled Initial: header ok, payload junk
                initial[:200] + bytes([initial[200] ^ 1]) + initial[201:],  # one flipped bit
            ]
            for _ in range(20):
                datagrams.append(initial[:20] + rnd(len(initial) - 20))
            ep = next(iter(p.tb._listen_eps))
            drops_before = ep.drops
            for d in datagrams:
                junk.sendto(d, (host, port))
            await asyncio.sleep(0.3)
            assert ep.drops - drops_before == len(datagrams)  # every one dropped and counted
            assert ep.pending == 0  # no state kept for any of them
            junk.sendto(initial, (host, port))  # a replayed valid Initial: a harmless half-open
            junk.close()
            await asyncio.sleep(0.1)
            assert ep.pending <= 1
            # the existing connection and a new one still work
            s = await p.client.open_stream()
            s.write(b"still alive")
            await s.close()
            assert await read_all(s) == b"still alive"
            c2 = await p.ta.dial(p.addr, p.tb.keypair.peer_id)
            assert c2.remote_peer == p.tb.keypair.peer_id

    run(main)


def test_datagrams_that_do_not_decrypt_are_no_news_of_the_peer() -> None:
    """``last_received`` (what liveness and keepalive judge by) moves only for packets that
    decrypt: junk sent to the connection's own connection ID, from anywhere, proves nothing."""

    async def main() -> None:
        async with pair() as p:
            serve_echo(p.server)
            host, port = p.addr.host_port()
            await asyncio.sleep(0.3)
            before = p.server.last_received
            cids = list(p.server._cids)
            junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for _ in range(20):
                for cid in cids:
                    junk.sendto(bytes([0x40 | (os.urandom(1)[0] & 0x1F)]) + cid + os.urandom(60), (host, port))
                await asyncio.sleep(0.02)
            junk.close()
            assert p.server.last_received == before
            s = await p.client.open_stream()  # real traffic does count
            s.write(b"hi")
            await s.close()
            assert await read_all(s) == b"hi"
            assert p.server.last_received > before

    run(main)


# -- streams ------------------------------------------------------------------------------------


def test_many_streams_both_directions_echo() -> None:
    async def main() -> None:
        async with pair() as p:
            serve_echo(p.server)
            serve_echo(p.client)

            async def one(conn: Connection, i: int) -> None:
                s = await conn.open_stream()
                payload = os.urandom(1000 + 37 * i)
                s.write(payload)
                await s.drain()
                await s.close()
                assert await read_all(s) == payload

            await asyncio.gather(*(one(p.client, i) for i in range(60)), *(one(p.server, i) for i in range(60)))
            await asyncio.sleep(0.05)
            assert p.client.num_streams == 0 and p.server.num_streams == 0

    run(main)


def test_half_close() -> None:
    async def main() -> None:
        async with pair() as p:
            done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def handler(s: Stream) -> None:
                request = await read_all(s)  # until the client's FIN
                done.set_result(request)
                s.write(b"reply to " + request)  # our side is still open
                await s.close()

            p.server.set_stream_handler(lambda s: asyncio.ensure_future(handler(s)))
            s = await p.client.open_stream()
            s.write(b"question")
            await s.close()
            with pytest.raises(StreamClosed):
                s.write(b"more")
            assert await done == b"question"
            assert await read_all(s) == b"reply to question"
            assert await s.read() == b""  # EOF is sticky

    run(main)


def test_reset_by_client_is_seen_by_server() -> None:
    async def main() -> None:
        async with pair() as p:
            server_stream: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
            p.server.set_stream_handler(server_stream.set_result)
            s = await p.client.open_stream()
            s.write(b"x" * 1000)
            ss = await asyncio.wait_for(server_stream, 5)
            assert await ss.readexactly(1000) == b"x" * 1000
            s.reset()
            with pytest.raises(StreamReset):
                await s.read()
            with pytest.raises(StreamReset):
                s.write(b"y")
            with pytest.raises(StreamReset):
                await asyncio.wait_for(ss.read(), 5)
            # STOP_SENDING reached the server too: its writes fail
            for _ in range(100):
                try:
                    ss.write(b"z")
                except StreamReset:
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("server stream stayed writable after the peer's reset")
            await asyncio.sleep(0.05)
            assert p.client.num_streams == 0 and p.server.num_streams == 0

    run(main)


def test_reset_by_server_is_seen_by_client() -> None:
    async def main() -> None:
        async with pair() as p:
            p.server.set_stream_handler(lambda s: s.reset())
            s = await p.client.open_stream()
            s.write(b"hello")
            with pytest.raises(StreamReset):
                await asyncio.wait_for(s.read(), 5)

    run(main)


def test_inbound_streams_wait_for_a_handler() -> None:
    async def main() -> None:
        async with pair() as p:
            s = await p.client.open_stream()
            s.write(b"early")
            await s.close()
            await asyncio.sleep(0.1)  # arrives before the server installed a handler
            got: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
            p.server.set_stream_handler(got.set_result)
            ss = await asyncio.wait_for(got, 1)
            assert await read_all(ss) == b"early"

    run(main)


def test_stream_limit() -> None:
    async def main() -> None:
        async with pair(max_streams=8) as p:
            serve_echo(p.server)
            streams = [await p.client.open_stream() for _ in range(8)]
            with pytest.raises(StreamLimit):
                await p.client.open_stream()
            for s in streams[:4]:
                s.write(b"a")
                await s.close()
                assert await read_all(s) == b"a"
            # four slots are free again; the new streams work end to end
            more = [await p.client.open_stream() for _ in range(4)]
            with pytest.raises(StreamLimit):
                await p.client.open_stream()
            for s in more + streams[4:]:
                s.write(b"b")
                await s.close()
            for s in more + streams[4:]:
                assert await asyncio.wait_for(read_all(s), 5) == b"b"

    run(main)


def test_64mib_transfer_sha256() -> None:
    async def main() -> None:
        async with pair() as p:
            digest: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

            async def sink(s: Stream) -> None:
                h, n = hashlib.sha256(), 0
                while True:
                    data = await s.read(1 << 20)
                    if not data:
                        break
                    h.update(data)
                    n += len(data)
                digest.set_result((n, h.hexdigest()))
                await s.close()

            p.server.set_stream_handler(lambda s: asyncio.ensure_future(sink(s)))
            s = await p.client.open_stream()
            block = os.urandom(1 << 20)
            h = hashlib.sha256()
            for i in range(64):
                chunk = bytes([i]) + block[1:]
                h.update(chunk)
                s.write(chunk)
                await s.drain()
            await s.close()
            assert await digest == (64 << 20, h.hexdigest())
            # what the dashboard reads of the path: UDP payload bytes (the data plus QUIC's
            # overhead one way, acknowledgements the other) and aioquic's smoothed RTT; on a
            # loaded CI machine datagrams are lost on loopback too and sent again (73.6 MB once:
            # 12% more), so the bound is what counting the data twice would break
            sent, got = p.client.path_stats(), p.server.path_stats()
            assert 64 << 20 < sent["bytes_sent"] < 96 << 20 and sent["bytes_received"] < 4 << 20, sent
            assert 64 << 20 < got["bytes_received"] <= sent["bytes_sent"], (sent, got)
            assert 0 < sent["rtt_ms"] < 1000 and 0 < got["rtt_ms"] < 1000

    run(main, timeout=60)


async def _push(p: Pair, total: int, block: int = 1 << 20) -> tuple[Stream, QuicConn]:
    """Send ``total`` bytes client -> server on one stream; returns the server's stream once all
    arrived intact (the last byte of each block numbers it)."""
    done: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()

    async def sink(s: Stream) -> None:
        h, n = hashlib.sha256(), 0
        while data := await s.read(1 << 20):
            h.update(data)
            n += len(data)
        done.set_result(s) if (n, h.digest()) == (total, want.digest()) else done.set_exception(AssertionError(n))

    p.server.set_stream_handler(lambda s: asyncio.ensure_future(sink(s)))
    s = await p.client.open_stream()
    want, data = hashlib.sha256(), os.urandom(block)
    for i in range(total // block):
        chunk = data[:-1] + bytes([i & 0xFF])
        want.update(chunk)
        s.write(chunk)
        await s.drain()
    await s.close()
    return await done, p.server


def test_loopback_datagrams_carry_stream_frames_longer_than_16k() -> None:
    """On loopback a datagram is up to 65,000 bytes and a STREAM frame fills it (its length a
    4-byte varint, which aioquic writes only up to 16 KiB); elsewhere datagrams stay 1,350."""

    async def main() -> None:
        async with pair() as p:
            sizes: list[int] = []
            ep = p.client._endpoint
            real = ep.sendto
            ep.sendto = lambda data, addr: (sizes.append(len(data)), real(data, addr))[1]  # type: ignore[method-assign]
            await _push(p, 16 << 20)
            assert max(sizes) > 60_000 and max(sizes) <= 65_000
            assert sum(1 for n in sizes if n > 16384) >= (16 << 20) // 65_000 - 8
            assert p.ta._new_quic(is_client=True, peer_addr=("192.0.2.1", 1))._max_datagram_size == 1350

    run(main, timeout=60)


def test_real_path_datagrams_leave_in_gso_runs_and_arrive_intact() -> None:
    """At a real path's 1,350 bytes, bulk data leaves as UDP GSO sends (the kernel cuts each
    into datagrams, the receiver reads them one by one) and the stream arrives intact."""

    async def main() -> None:
        async with pair(loopback_datagram_size=1350) as p:
            ep = p.client._endpoint
            await _push(p, 16 << 20)
            assert ep.gso, "this kernel refused UDP GSO on loopback"
            assert ep.gso_sends > 100  # (16 MiB is ~12,400 datagrams; at most 48 leave per send)
        async with pair(loopback_datagram_size=1350, gso=False) as p:  # the transport option turns it off
            await _push(p, 4 << 20)
            assert p.client._endpoint.gso_sends == 0

    run(main, timeout=60)


def test_stream_windows_grow_while_the_window_holds_the_sender_back(monkeypatch) -> None:
    """A small stream window that a fast transfer fills every round trip doubles up to
    max_stream_window, and the connection window follows; with max_stream_window at the
    window's own size it stays fixed."""
    # On loopback the measured round trip is tens of microseconds, so whether a window "holds
    # the sender back" (a quarter of it read within half a round trip) turns on CPU scheduling:
    # on a loaded machine the reader never keeps up that closely and nothing grows. The tuning
    # sees a 20 ms round trip here (a region link's), so this checks the wiring over real
    # sockets (credit updates, the connection window following, the cap); the rule itself is
    # driven with a chosen clock in tests/unit/test_quic_stream_window.py.
    monkeypatch.setattr(LatticaQuicConnection, "smoothed_rtt", lambda self: 0.020)
    window = 256 * 1024

    async def main() -> None:
        async with pair(max_stream_data=window, max_data=4 * window, max_stream_window=4 << 20) as p:
            s, server = await _push(p, 96 << 20)
            assert window < s._window <= 4 << 20, s._window
            assert server._quic._conn_window >= s._window * 3 // 2
            assert s._window & (s._window - 1) == 0  # doublings of 256 KiB
        async with pair(max_stream_data=window, max_data=4 * window, max_stream_window=window) as p:
            s, server = await _push(p, 16 << 20)
            assert s._window == window and server._quic._conn_window == 4 * window

    run(main, timeout=90)


def test_receive_memory_is_bounded_when_the_app_does_not_read() -> None:
    window = 256 * 1024

    async def main() -> None:
        async with pair(max_stream_data=window, max_data=4 * window, send_high_water=window) as p:
            got: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
            p.server.set_stream_handler(got.set_result)
            s = await p.client.open_stream()
            total = 0

            async def writer() -> None:
                nonlocal total
                block = b"q" * 65536
                for _ in range(256):  # 16 MiB, far beyond the window
                    s.write(block)
                    total += len(block)
                    await s.drain()
                await s.close()

            w = asyncio.ensure_future(writer())
            ss = await asyncio.wait_for(got, 5)
            await asyncio.sleep(0.5)
            assert not w.done()  # the writer is blocked by flow control
            unread = p.server._quic.rx_unread
            assert 0 < unread <= window  # the peer may not send past the credit we granted
            assert total <= window + 2 * window + 65536  # credit + send buffer + one block
            n = len(await read_all(ss))  # reading releases credit: everything arrives
            await w
            assert n == 256 * 65536
            assert p.server._quic.rx_unread == 0

    run(main)


def test_a_peer_that_stops_acknowledging_holds_a_writer_at_the_send_cap() -> None:
    """drain() lets a writer go on while its bytes go out, but not while more than the send cap
    waits for acknowledgements: a peer that grants credit and goes silent bounds our memory."""

    async def main() -> None:
        async with pair(send_high_water=64 * 1024) as p:
            p.client._send_cap = (
                256 * 1024
            )  # (the default, 32 MiB + 64 KiB, is above aioquic's first congestion window)
            got: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
            p.server.set_stream_handler(got.set_result)
            s = await p.client.open_stream()
            s.write(b"hello")
            await s.drain()
            ss = await asyncio.wait_for(got, 5)
            silent = True
            ep = p.server._endpoint
            real = ep.sendto
            ep.sendto = lambda data, addr: None if silent else real(data, addr)  # type: ignore[method-assign]
            written = 5

            async def writer() -> None:
                nonlocal written
                block = b"w" * 65536
                for _ in range(64):  # 4 MiB, within the peer's credit
                    s.write(block)
                    written += len(block)
                    await s.drain()
                await s.close()

            w = asyncio.ensure_future(writer())
            await asyncio.sleep(0.5)
            assert not w.done()
            held = p.client._quic.send_buffered(s.stream_id)
            assert 256 * 1024 < held <= 256 * 1024 + 64 * 1024 + 65536 and 0 <= written - held <= 5
            silent = False  # acknowledgements flow again (the lost ones are retransmitted)
            assert len(await asyncio.wait_for(read_all(ss), 20)) == written
            await w

    run(main)


def test_finished_unread_streams_do_not_starve_the_connection() -> None:
    """Streams the app closed without reading release their connection-level credit."""
    window = 64 * 1024

    async def main() -> None:
        async with pair(max_stream_data=window, max_data=4 * window) as p:
            kept: list[Stream] = []

            def handler(s: Stream) -> None:
                kept.append(s)  # held, never read
                asyncio.ensure_future(s.close())

            p.server.set_stream_handler(handler)

            async def one() -> None:
                s = await p.client.open_stream()
                s.write(b"d" * window)
                await s.close()
                assert await read_all(s) == b""

            for _ in range(12):  # 3x the connection window in total
                await asyncio.wait_for(one(), 5)
            assert len(kept) == 12
            assert len(await read_all(kept[0])) == window  # still readable afterwards

    run(main)


# -- closing ------------------------------------------------------------------------------------


def test_closing_the_transport_fails_a_pending_dial() -> None:
    async def main() -> None:
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        t = QuicTransport(KeyPair.generate(), handshake_timeout=10)
        try:
            dial = asyncio.ensure_future(t.dial(Multiaddr(f"/ip4/127.0.0.1/udp/{silent.getsockname()[1]}/quic-v1")))
            await asyncio.sleep(0.1)
            await t.close()
            with pytest.raises(TransportError):
                await asyncio.wait_for(dial, 2)
        finally:
            silent.close()

    run(main)


def test_close_propagates_to_the_peer() -> None:
    async def main() -> None:
        async with pair() as p:
            got: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
            p.server.set_stream_handler(got.set_result)
            s = await p.client.open_stream()
            s.write(b"hi")
            ss = await asyncio.wait_for(got, 5)
            assert await ss.read() == b"hi"
            pending_read = asyncio.ensure_future(ss.read())
            own_read = asyncio.ensure_future(s.read())
            calls: list[Connection] = []
            p.server.add_close_callback(calls.append)
            p.client.add_close_callback(calls.append)
            await p.client.close()
            assert p.client.is_closed
            with pytest.raises(ConnectionClosed):
                await own_read
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(pending_read, 5)
            await asyncio.wait_for(p.server.wait_closed(), 5)
            assert p.server.is_closed
            assert sorted(map(id, calls)) == sorted([id(p.client), id(p.server)])
            with pytest.raises(ConnectionClosed):
                await p.server.open_stream()
            with pytest.raises(ConnectionClosed):
                ss.write(b"late")

    run(main)


def test_close_delivers_data_written_before_it() -> None:
    async def main() -> None:
        async with pair() as p:
            got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def sink(s: Stream) -> None:
                try:
                    got.set_result(await read_all(s))
                except ConnectionClosed as e:
                    got.set_exception(e)

            p.server.set_stream_handler(lambda s: asyncio.ensure_future(sink(s)))
            s = await p.client.open_stream()
            payload = os.urandom(2 << 20)
            s.write(payload)
            await s.close()
            await p.client.close()  # lingers until the data is acknowledged
            assert await asyncio.wait_for(got, 5) == payload

    run(main)


def test_close_returns_once_its_connection_close_is_sent() -> None:
    """close() does not wait out the closing period (3 PTO: across a 150 ms path ~0.8 s of a
    script's exit); the period runs on by itself, and a closing transport ends it at once."""

    async def main() -> None:
        async with pair() as p:
            await p.client.close()
            assert p.client.is_closed and not p.client._terminated.is_set()  # still answering late packets
            await asyncio.wait_for(p.client.wait_closed(), 3)  # and then forgotten, by aioquic's timer
            await asyncio.wait_for(p.server.wait_closed(), 5)
        async with pair() as p:
            await p.client.close()
            assert not p.client._terminated.is_set()
            await p.ta.close()
            assert p.client._terminated.is_set()

    run(main)


def test_abort_propagates_to_the_peer() -> None:
    async def main() -> None:
        async with pair() as p:
            p.client.abort("testing")
            assert p.client.is_closed
            await asyncio.wait_for(p.client.wait_closed(), 1)
            await asyncio.wait_for(p.server.wait_closed(), 5)
            with pytest.raises(ConnectionClosed):
                await p.client.open_stream()

    run(main)


def test_keepalive_outlives_the_idle_timeout() -> None:
    async def main() -> None:
        async with pair(idle_timeout=1.0) as p:
            await asyncio.sleep(2.5)  # idle, but PINGs every 0.5 s keep it alive
            assert not p.client.is_closed and not p.server.is_closed
            serve_echo(p.server)
            s = await p.client.open_stream()
            s.write(b"x")
            await s.close()
            assert await read_all(s) == b"x"

    run(main)


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")

    async def main() -> None:
        ta, tb = QuicTransport(KeyPair.generate()), QuicTransport(KeyPair.generate())
        try:
            lb = await tb.listen(Multiaddr("/ip6/::1/udp/0/quic-v1"), serve_echo)
            assert lb.addrs[0].protocols() == ["ip6", "udp", "quic-v1"]
            c = await ta.dial(lb.addrs[0], tb.keypair.peer_id)
            assert c.remote_addr == lb.addrs[0]
            s = await c.open_stream()
            s.write(b"v6")
            await s.close()
            assert await read_all(s) == b"v6"
        finally:
            await ta.close()
            await tb.close()

    run(main)


# -- two processes ------------------------------------------------------------------------------

_ECHO_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from lattica._identity import KeyPair
    from lattica._multiaddr import Multiaddr
    from lattica.transports.quic import QuicTransport

    async def echo(s):
        while True:
            data = await s.read(1 << 20)
            if not data:
                break
            s.write(data)
            await s.drain()
        await s.close()

    async def main():
        t = QuicTransport(KeyPair.generate())
        on_conn = lambda c: c.set_stream_handler(lambda s: asyncio.ensure_future(echo(s)))
        listener = await t.listen(Multiaddr("/ip4/127.0.0.1/udp/0/quic-v1"), on_conn)
        print("READY", listener.addrs[0], t.keypair.peer_id, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await t.close()

    asyncio.run(main())
    """
)


def test_two_processes_64mib_echo() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = ""
        deadline = time.monotonic() + 20
        while not line.startswith("READY") and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line and child.poll() is not None:
                break
        assert line.startswith("READY"), "echo server did not start"
        _, addr, peer = line.split()

        async def main() -> None:
            from lattica._identity import PeerId

            t = QuicTransport(KeyPair.generate())
            try:
                conn = await t.dial(Multiaddr(addr), PeerId.from_string(peer))
                s = await conn.open_stream()
                sent, received = hashlib.sha256(), hashlib.sha256()
                block = os.urandom(1 << 20)

                async def reader() -> int:
                    n = 0
                    while True:
                        data = await s.read(1 << 20)
                        if not data:
                            return n
                        received.update(data)
                        n += len(data)

                r = asyncio.ensure_future(reader())
                for i in range(64):
                    chunk = bytes([i]) + block[1:]
                    sent.update(chunk)
                    s.write(chunk)
                    await s.drain()
                await s.close()
                assert await r == 64 << 20
                assert received.hexdigest() == sent.hexdigest()
                await conn.close()
            finally:
                await t.close()

        run(main, timeout=60)
    finally:
        end_child(child, 10)
