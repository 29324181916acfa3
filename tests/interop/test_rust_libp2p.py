"""Interop with rust-libp2p 0.54 (the GradientHQ Lattica SDK wheel), real processes on 127.0.0.1,
both directions, TCP (multistream-select, /noise with ChaChaPoly, yamux) and QUIC (libp2p-TLS,
ALPN "libp2p", multistream-selected streams): connect, identify both ways on /ipfs/id/1.0.0, ping
on /ipfs/ping/1.0.0."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

import lattica
from lattica.bench._peers import SDK_PEER

LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
PEER = SDK_PEER


def _sdk(sdk_python: pathlib.Path, *args: str, timeout: float = 60) -> dict:
    home = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "lattica-sdk-home"  # (it keeps a key and a DHT there)
    home.mkdir(exist_ok=True)
    out = subprocess.run(
        [str(sdk_python), str(PEER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=home,
        env={**os.environ, "HOME": str(home)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_a_rust_libp2p_node_dials_ours_identifies_both_ways_and_pings(sdk_python, transport):
    with lattica.Node([LISTEN[transport]]) as node:
        seen: list = []

        async def watch():
            node._host.events.identified.subscribe(seen.append)

        node.run(watch())
        got = _sdk(sdk_python, "dial", str(node.addrs[0]))
        ident = got.get("identify")
        assert ident is not None, got
        # what rust-libp2p read of us on /ipfs/id/1.0.0
        assert ident["protocol_version"] == "/lattica/1.0.0"
        assert ident["agent_version"].startswith("lattica-py/")
        assert str(node.addrs[0]).split("/p2p/")[0] in ident["listen_addrs"]
        assert {"/ipfs/id/1.0.0", "/ipfs/ping/1.0.0"} <= set(ident["protocols"])
        assert got["rtt_ms"] is not None  # its pings of us came back
        # what we read of it: a libp2p peer on a libp2p connection, identified, a stranger
        rust = [i for i in seen if str(i.peer_id) == got["peer_id"]]
        assert rust, seen
        assert rust[0].transport == transport and rust[0].circle == "stranger"
        assert rust[0].protocol_version == "/lattica/1.0.0" and "/ipfs/ping/1.0.0" in rust[0].protocols
        assert any("/tcp/" in str(a) for a in rust[0].listen_addrs)
        assert any("/quic-v1" in str(a) for a in rust[0].listen_addrs)
        # and ours goes on serving: a Lattica node still reaches it the Lattica way
        with lattica.Node([LISTEN[transport]]) as other:
            other.connect(node.addrs[0])
            assert other.ping(node.peer_id) > 0


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_ours_dials_a_rust_libp2p_node_identifies_both_ways_and_pings(sdk_python, transport):
    home = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "lattica-sdk-home"
    home.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [str(sdk_python), str(PEER), "listen"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=home,
        env={**os.environ, "HOME": str(home)},
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        hello = json.loads(proc.stdout.readline())
        with lattica.Node([LISTEN[transport]]) as node:
            # over TCP the first dial offers the Lattica handshake, which the rust node cuts off:
            # the transport then speaks libp2p to it, and remembers; over QUIC, ALPN decides
            addr = next(a for a in hello["addrs"] if ("/quic-v1" in a) == (transport == "quic"))
            info = node.connect(addr)
            assert info.transport == transport
            assert str(info.peer_id) == hello["peer_id"]
            assert info.protocol_version == "/lattica/1.0.0"  # (the SDK's own)
            assert "/ipfs/ping/1.0.0" in info.protocols and "/ipfs/id/1.0.0" in info.protocols
            assert info.circle == "stranger"
            assert node.ping(info.peer_id) > 0  # /ipfs/ping/1.0.0, negotiated on a yamux stream

            async def unknown_protocol():
                # proposed lazily, data right behind it: the refusal comes with the first read
                conn = node._host.conns[info.peer_id]
                stream = await node._host.open_stream_on(conn, "/lattica/nothing/1.0.0")
                stream.write(b"hello")
                with pytest.raises(lattica.errors.UnsupportedProtocol):
                    await stream.read()
                return True

            assert node.run(unknown_protocol(), timeout=10)
            proc.stdin.write(f"{node.peer_id}\n")
            proc.stdin.flush()
            seen = json.loads(proc.stdout.readline())
            assert seen["identify"] is not None, seen  # it identified us on /ipfs/id/1.0.0 too
            assert seen["identify"]["agent_version"].startswith("lattica-py/")
            assert "/ipfs/ping/1.0.0" in seen["identify"]["protocols"]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
