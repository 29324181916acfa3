"""Our TCP dial to a libp2p listener that does not choose the muxer inside the Noise handshake
(rust-libp2p's way): ``/yamux/1.0.0`` is proposed lazily, the connection is up at once and its
first frames travel right behind the proposal; a listener that refuses the muxer closes it."""

from __future__ import annotations

import asyncio

from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.transports import multistream
from lattica.transports.noise import LIBP2P_PROTOCOL_NAME, NoiseHandshake
from lattica.transports.tcp import SECURITY, YAMUX, TcpTransport


async def _libp2p_listener(accept_yamux: bool, seen: asyncio.Queue[bytes]) -> asyncio.Server:
    """A bare libp2p listener from our sans-IO parts: multistream-select of ``/noise``, Noise with
    no muxer offered, then multistream-select of the muxer, answered only once the dialer's
    proposal and frames behind it were read. Puts every plaintext read after Noise on ``seen``."""
    keypair = KeyPair.generate()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        select = multistream.Listener(lambda p: p == SECURITY, lambda: (SECURITY,))
        hs = NoiseHandshake(keypair, False, protocol_name=LIBP2P_PROTOCOL_NAME)
        agreed = None
        while agreed is None:
            select.receive(await reader.read(65536))
            writer.write(select.data_to_send())
            agreed = select.next_event()
        assert isinstance(agreed, multistream.Agreed)
        pending = agreed.data
        while not hs.complete:
            writer.write(hs.receive(pending))
            if not hs.complete:
                pending = await reader.read(65536)
        session = hs.session
        assert session is not None
        muxer = multistream.Listener(lambda p: accept_yamux and p == YAMUX, lambda: ())
        proposal = len(multistream.encode(multistream.HEADER) + multistream.encode(YAMUX))
        held, ciphertext = b"", hs.leftover
        while True:
            plain = session.open(ciphertext) if ciphertext else None
            if plain:
                await seen.put(bytes(plain))
                held += plain
                # a dialer that waited for our answer before sending frames would wait forever
                if not muxer.done and (len(held) > proposal or not accept_yamux):
                    muxer.receive(held)
                    writer.write(session.seal(muxer.data_to_send()))
            ciphertext = await reader.read(65536)
            if not ciphertext:
                break
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def _dial(server: asyncio.Server) -> tuple[TcpTransport, object]:
    port = server.sockets[0].getsockname()[1]
    transport = TcpTransport(KeyPair.generate())
    transport._libp2p_at[("127.0.0.1", port)] = None  # (as after a first dial found a libp2p node)
    return transport, await asyncio.wait_for(transport.dial(Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")), 10)


def test_the_muxer_proposal_is_lazy_and_frames_follow_it():
    async def run():
        seen: asyncio.Queue[bytes] = asyncio.Queue()
        server = await _libp2p_listener(True, seen)
        _, conn = await _dial(server)
        stream = await conn.open_stream()  # (up before the listener answered the proposal)
        stream.write(b"right behind")
        first = await asyncio.wait_for(seen.get(), 5)
        got = first
        while b"right behind" not in got:
            got += await asyncio.wait_for(seen.get(), 5)
        assert first.startswith(multistream.encode(multistream.HEADER) + multistream.encode(YAMUX))
        assert not conn.is_closed
        conn.abort("done")
        server.close()

    asyncio.run(run())


def test_a_listener_refusing_the_muxer_closes_the_connection():
    async def run():
        seen: asyncio.Queue[bytes] = asyncio.Queue()
        server = await _libp2p_listener(False, seen)
        _, conn = await _dial(server)
        for _ in range(100):
            if conn.is_closed:
                break
            await asyncio.sleep(0.05)
        server.close()
        return conn.is_closed

    assert asyncio.run(run())
