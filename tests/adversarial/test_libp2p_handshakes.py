"""A peer that opens with multistream-select (a libp2p peer, or one pretending) and then
misbehaves: the socket is closed, within the handshake's deadline, and the node goes on serving."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import lattica
from lattica._protobuf import uvarint
from lattica.transports.multistream import HEADER, MAX_MESSAGE, MAX_PROPOSALS, encode

HELLO = encode(HEADER)


def _closed_after(addr: tuple[str, int], data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data``; return everything the node answered once it closed the socket (fails if it
    did not within ``timeout``)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(data)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got
            if not chunk:
                return got
            got += chunk
        raise AssertionError(f"the node kept the socket open; it answered {got[:200]!r}")


@pytest.mark.parametrize(
    "wire",
    [
        HELLO + b"".join(encode(f"/tls/{i}") for i in range(MAX_PROPOSALS + 2)),  # proposes forever
        HELLO + encode("ls") * 5,  # lists without end
        HELLO + uvarint(MAX_MESSAGE + 1) + b"x" * (MAX_MESSAGE + 1),  # an oversized message
        HELLO + encode("/noise") + b"\x00\x20" + b"\x07" * 32 + b"\x00\x05junk!",  # /noise, then garbage
        HELLO + b"\x05/a/b\x00",  # a message without its newline
    ],
    ids=["proposals", "ls-flood", "oversized", "noise-garbage", "no-newline"],
)
def test_a_misbehaving_libp2p_opening_is_closed_and_the_node_serves_on(wire):
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options={"tcp": {"handshake_timeout": 3}}) as node:
        host, port = node.addrs[0].host_port()
        got = _closed_after((host, port), wire)
        assert got.startswith(HELLO) or got == b""  # (at most our half of the negotiation, then closed)
        with lattica.Node(["/ip4/127.0.0.1/tcp/0"]) as other:
            other.connect(node.addrs[0])
            assert other.ping(node.peer_id) > 0


def test_a_silent_libp2p_opening_is_closed_by_the_handshake_deadline():
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], transport_options={"tcp": {"handshake_timeout": 2}}) as node:
        host, port = node.addrs[0].host_port()
        t0 = time.monotonic()
        got = _closed_after((host, port), HELLO + encode("/noise"), timeout=15)
        assert got == HELLO + encode("/noise")  # agreed, then waited for a Noise message that never came
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("how", ["close", "reset"])
def test_an_endpoint_that_answers_neither_stack_gets_one_dial_a_time_not_two(how):
    """An endpoint that accepts and hangs up without a byte looks like a libp2p node to our first
    dial (rust resets our handshake so) and gets the libp2p stack's dial too; when that fails as
    well, it is remembered for a while: a node dialing it again makes one connection, not two."""
    from lattica._identity import KeyPair  # (the transport alone: the node's dialer retries)
    from lattica._multiaddr import Multiaddr
    from lattica.errors import TransportError
    from lattica.transports.tcp import TcpTransport

    accepted = 0

    async def hang_up(reader, writer):
        nonlocal accepted
        accepted += 1
        if how == "reset":
            writer.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        writer.close()

    async def run():
        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = TcpTransport(KeyPair.generate())
        addr = Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
        counts = []
        for _ in range(3):
            before = accepted
            with pytest.raises(TransportError):
                await transport.dial(addr)
            await asyncio.sleep(0.05)
            counts.append(accepted - before)
        server.close()
        return counts

    assert asyncio.run(run()) == [2, 1, 1]
