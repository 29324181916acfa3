"""Two real processes on 127.0.0.1, over TCP and over QUIC: identify, ping, and a 1 GiB stream
transfer whose sha256 is checked by the receiving process."""

import hashlib
import os

import pytest

import lattica
from lattica.mesh.process import SINK, ServerProcess

GIB = 1 << 30


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]) as srv:
        yield srv


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_identify_and_ping_across_processes(server, transport):
    with lattica.Node([]) as node:
        info = node.connect(server.addr(transport))
        assert str(info.peer_id) == server.peer_id
        assert info.transport == transport
        assert {str(a.with_peer_id(info.peer_id)) for a in info.listen_addrs} == set(server.addrs)
        assert info.observed_addr is not None
        rtts = node.ping_many(info.peer_id, 200)
        assert len(rtts) == 200 and all(0 < r < 1 for r in rtts)


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_one_gib_stream_transfer_verified_by_sha256(server, transport):
    block = os.urandom(1 << 20)
    expected = hashlib.sha256()
    for i in range(GIB // len(block)):
        expected.update(block[:-4] + i.to_bytes(4, "big"))
    with lattica.Node([]) as node:
        info = node.connect(server.addr(transport))

        async def push():
            s = await node.aopen_stream(info.peer_id, SINK)
            for i in range(GIB // len(block)):
                s.write(block[:-4] + i.to_bytes(4, "big"))  # every MiB differs: reordering would show
                await s.drain()
            await s.close()
            return (await s.read(200)).decode()

        reply = node.run(push(), timeout=600)
    count, digest = reply.split(":")
    assert int(count) == GIB
    assert digest == expected.hexdigest()
