"""Interop with go-libp2p 0.32 (the p2pd daemon of the hivemind 1.1.12 wheel), real processes on
127.0.0.1, both directions over TCP and QUIC: connect, identify, ping on /ipfs/ping/1.0.0, and one
stream echoing 64 MiB through go-yamux. go offers its muxers inside the Noise handshake, so TCP
here also runs the inlined muxer negotiation."""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile

import pytest

import lattica
from lattica._protobuf import decode_fields
from lattica.bench._peers.p2pd import daemon, read_delimited

from .echo import echo_through

LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
ECHO = "/lattica-test/echo/1.0.0"


def _ours(addrs, transport: str):
    return [a for a in addrs if ("/quic-v1" in str(a)) == (transport == "quic")]


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_go_dials_ours_and_pings_it(p2pd_binary, transport):
    with daemon(p2pd_binary) as go, lattica.Node([LISTEN[transport]]) as node:
        seen: list = []

        async def run():
            node._host.events.identified.subscribe(seen.append)
            go_peer, _ = await go.identify()
            await go.connect(node.peer_id, [a.without_peer_id() for a in node.addrs])
            reader, writer = await go.open_stream(node.peer_id, "/ipfs/ping/1.0.0")
            payload = os.urandom(32)
            writer.write(payload)
            await writer.drain()
            echo = await asyncio.wait_for(reader.readexactly(32), 10)
            writer.close()
            for _ in range(100):  # (go identifies right after connecting; we ask it too)
                if any(i.peer_id == go_peer for i in seen):
                    break
                await asyncio.sleep(0.05)
            return go_peer, payload, echo

        go_peer, payload, echo = node.run(run(), timeout=30)
        assert echo == payload
        info = next(i for i in seen if i.peer_id == go_peer)
        assert info.transport == transport and info.circle == "stranger"
        assert "/ipfs/ping/1.0.0" in info.protocols and info.listen_addrs


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_ours_dials_go_identifies_and_pings(p2pd_binary, transport):
    with daemon(p2pd_binary) as go, lattica.Node([LISTEN[transport]]) as node:
        go_peer, go_addrs = node.run(go.identify(), timeout=10)
        info = node.connect(str(_ours(go_addrs, transport)[0].with_peer_id(go_peer)))
        assert info.peer_id == go_peer and info.transport == transport
        assert "/ipfs/id/1.0.0" in info.protocols and "/ipfs/ping/1.0.0" in info.protocols
        assert node.ping(go_peer) > 0


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_one_stream_echoes_64_mib_through_go(p2pd_binary, transport):
    """Our stream to go's node, which hands it to a handler that echoes every byte back: flow
    control and framing agree both ways for 64 MiB."""
    size = 64 << 20
    with tempfile.TemporaryDirectory(prefix="echo-") as tmp, daemon(p2pd_binary) as go:
        sock = pathlib.Path(tmp) / "echo.sock"
        with lattica.Node([LISTEN[transport]]) as node:

            async def echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                decode_fields(await read_delimited(reader))  # (the daemon's StreamInfo)
                while chunk := await reader.read(1 << 16):
                    writer.write(chunk)
                    await writer.drain()
                writer.close()

            async def run():
                server = await asyncio.start_unix_server(echo_handler, str(sock))
                await go.serve(ECHO, sock)
                go_peer, go_addrs = await go.identify()
                await node._host.dial_addrs(go_peer, _ours(go_addrs, transport))
                stream = await node._host.open_stream(go_peer, ECHO)
                sent, got = await echo_through(stream, size, 60)
                server.close()
                return sent, got

            sent, got = node.run(run(), timeout=120)
            assert sent == got
