"""Our AutoNAT v2 server (``/libp2p/autonat/2/dial-request``) on loopback, asked by a client
written here from the spec over a real connection: a dial-back to the client's own IP carries
its nonce; another private IP is refused; a public one first costs the client its dial data
(the amplification guard), and a client that does not pay is dropped without a dial."""

from __future__ import annotations

import asyncio

import pytest

import lattica
from helpers import wait_for
from lattica._framing import read_delimited, write_delimited
from lattica._multiaddr import Multiaddr
from lattica.actors.nat import autonat
from lattica.errors import LatticaError
from lattica.nat import _autonat_v2_wire as w

TCP = "/ip4/127.0.0.1/tcp/0"
pytestmark = pytest.mark.timeout(60)


def _as_public(monkeypatch, ip: str) -> None:
    """Make the server take ``ip`` for a public address (nothing on loopback is)."""
    for name in ("is_loopback_ip", "is_private_ip"):
        real = getattr(autonat, name)
        monkeypatch.setattr(autonat, name, lambda x, real=real: x != ip and real(x))


def _ask(client: lattica.Node, server: lattica.Node, addrs: list[str], nonce: int, pay: bool = True):
    """Ask ``server`` to dial ``addrs``; (the messages it sent us, the nonces dialed back to us)."""
    host = client._host
    nonces: list[int] = []

    async def on_dial_back(stream, conn) -> None:
        nonces.append(w.decode_dial_back(await read_delimited(stream, 64)))
        write_delimited(stream, w.DIAL_BACK_OK)
        await stream.close()

    async def run() -> list:
        host.set_handler(w.DIAL_BACK, on_dial_back)
        conn = await host.get_connection(server.peer_id)
        stream = await host.open_stream_on(conn, w.DIAL_REQUEST)
        write_delimited(stream, w.encode(w.DialRequest(tuple(Multiaddr(a) for a in addrs), nonce)))
        got = []
        try:
            while True:
                msg = w.decode(await read_delimited(stream, w.MAX_MESSAGE))
                got.append(msg)
                if isinstance(msg, w.DialDataRequest) and pay:
                    for _ in range(msg.num_bytes // 4096 + 1):
                        write_delimited(stream, w.encode(w.DialDataResponse(b"\0" * 4096)))
                if isinstance(msg, w.DialResponse):
                    return got
        except LatticaError as e:
            return [*got, e]

    return client.run(run(), timeout=30), nonces


def test_a_dial_back_to_the_clients_own_ip_carries_its_nonce() -> None:
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        client.connect(server.addrs[0])
        mine = str(client.addrs[0].without_peer_id())
        got, nonces = _ask(client, server, ["/ip4/10.9.9.9/tcp/1", mine], 2**63 + 5)
        # the private address at another IP is passed over, ours is dialed
        assert got == [w.DialResponse(w.ResponseStatus.OK, 1, w.DialStatus.OK)]
        assert nonces == [2**63 + 5]
        assert server._host.services.autonat.v2_counts["reached"] == 1


def test_another_private_ip_is_refused_and_nothing_dialed() -> None:
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        client.connect(server.addrs[0])
        got, nonces = _ask(client, server, ["/ip4/192.168.7.7/tcp/4001", "/ip4/10.0.0.1/udp/1/quic-v1"], 1)
        assert got == [w.DialResponse(w.ResponseStatus.E_DIAL_REFUSED)] and nonces == []
        assert server._host.services.autonat.v2_counts["dialed"] == 0


def test_another_public_ip_costs_dial_data_first_then_is_dialed(monkeypatch) -> None:
    """The client listens at 127.0.0.2 and reaches the server from 127.0.0.1; 127.0.0.2 is made to
    count as a public address (nothing on loopback is), so the server asks for dial data, then
    dials it for real."""
    _as_public(monkeypatch, "127.0.0.2")
    with lattica.Node([TCP]) as server, lattica.Node(["/ip4/127.0.0.2/tcp/0"]) as client:
        client.connect(server.addrs[0])
        assert wait_for(lambda: client.peer_id in server._host.conns)  # (its side of the handshake ends last)
        assert str(server._host.conns[client.peer_id].remote_addr).startswith("/ip4/127.0.0.1/")
        other = str(client.addrs[0].without_peer_id())
        got, nonces = _ask(client, server, [other], 9)
        assert got[0] == w.DialDataRequest(0, autonat.DIAL_DATA) and 30_000 <= autonat.DIAL_DATA <= 100_000
        assert got[1] == w.DialResponse(w.ResponseStatus.OK, 0, w.DialStatus.OK) and nonces == [9]
        counts = server._host.services.autonat.v2_counts
        assert counts["dial_data"] == 1 and counts["reached"] == 1


def test_a_client_that_does_not_pay_is_dropped_without_a_dial(monkeypatch) -> None:
    monkeypatch.setattr(autonat, "_V2_TIMEOUT", 1.0)
    _as_public(monkeypatch, "127.0.0.2")
    with lattica.Node([TCP]) as server, lattica.Node(["/ip4/127.0.0.2/tcp/0"]) as client:
        client.connect(server.addrs[0])
        got, _ = _ask(client, server, [str(client.addrs[0].without_peer_id())], 9, pay=False)
        assert isinstance(got[0], w.DialDataRequest) and isinstance(got[-1], LatticaError)
        counts = server._host.services.autonat.v2_counts
        assert counts["dialed"] == 0 and counts["refused"] == 1
        assert client.ping(server.peer_id) > 0  # (the node serves on)


def test_a_stream_that_does_not_open_with_a_dial_request_is_reset() -> None:
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        client.connect(server.addrs[0])

        async def run() -> bytes | None:
            conn = await client._host.get_connection(server.peer_id)
            stream = await client._host.open_stream_on(conn, w.DIAL_REQUEST)
            write_delimited(stream, w.encode(w.DialDataResponse(b"x")))
            try:
                return await asyncio.wait_for(read_delimited(stream, 64), 5)
            except LatticaError:
                return None

        assert client.run(run(), timeout=10) is None
        assert server._host.services.autonat.v2_counts["refused"] == 1
