"""Two of our own nodes on the standard libp2p stack (multistream-select, /noise with ChaChaPoly,
yamux, /ipfs/id/1.0.0), as a libp2p peer that speaks our protocols would reach us: our protocols
are ordinary libp2p protocols, and such a peer, when it is not a member of our mesh, is a stranger,
answered and refused exactly as a stranger on our own stack is (issue 48, must-have 6)."""

from __future__ import annotations

import pytest

import lattica
import sample_actors as sa
from helpers import call_as, spawn_local, wait_for
from lattica._runtime import spawner_ref
from lattica.errors import PermissionDenied
from lattica.trust import MeshKey

TCP = "/ip4/127.0.0.1/tcp/0"


def _connect(caller: lattica.Node, target: lattica.Node, libp2p: bool) -> lattica.PeerInfo:
    """Connect ``caller`` to ``target``, on the libp2p stack if asked (as our TCP transport does
    once a libp2p listener answered it at that address)."""
    host, port = target.addrs[0].host_port()

    async def remember():
        caller._host.transport_set.named("tcp")._libp2p_at[(host, port)] = None

    if libp2p:
        caller.run(remember())
    info = caller.connect(target.addrs[0])
    assert caller._host.conns[target.peer_id].libp2p is libp2p
    return info


@pytest.mark.parametrize("libp2p", [False, True], ids=["lattica-stack", "libp2p-stack"])
def test_a_stranger_gets_the_same_answers_and_refusals_on_either_stack(libp2p):
    mesh = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=mesh, allow=["sample_actors.*"]) as node,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        _connect(stranger, node, libp2p)
        # (the node identifies the stranger a moment later: on the libp2p stack it asks for it)
        assert wait_for(lambda: any(p.peer_id == stranger.peer_id for p in node.peers()), timeout=5)
        assert {p.peer_id: p.circle for p in node.peers()}[stranger.peer_id] == "stranger"
        assert stranger.ping(node.peer_id) > 0
        # the open network's services answer: the DHT, over /lattica/rpc/2 on a negotiated stream
        lattica.dht.bootstrap(node=stranger).result(10)
        lattica.dht.put("libp2p-key", "value", node=stranger).result(10)
        assert lattica.dht.get("libp2p-key", node=node).result(10)[None].value == "value"
        # members-only ones refuse it, with the answer a stranger gets on our own stack
        counter = spawn_local(node, sa.Counter, 5, name="counter")
        for ref, method, args in [
            (counter, "incr", ()),
            (spawner_ref(node.peer_id), "spawn", ("sample_actors.Counter", [1], {})),
        ]:
            with pytest.raises(PermissionDenied, match="not a member of this node's mesh"):
                call_as(stranger, ref, method, *args)
        assert call_as(node, counter, "get") == 5


def test_a_libp2p_peers_misbehaving_streams_are_reset_and_the_connection_serves_on():
    """On a libp2p connection: a stream that proposes without end, one that floods ls, one that
    sends garbage for a header, and one that agrees on ping and then sends a short echo: each is
    reset (or answered and ended), and the same connection still pings and answers calls."""
    from lattica.transports.multistream import HEADER, MAX_PROPOSALS, encode  # (the wire, spelled out)

    with lattica.Node([TCP]) as node, lattica.Node([TCP]) as peer:
        _connect(peer, node, libp2p=True)
        hello = encode(HEADER)

        async def misbehave(wire: bytes) -> bytes:
            conn = peer._host.conns[node.peer_id]
            stream = await conn.open_stream()
            stream.write(wire)
            await stream.close()  # (our side ends: a handler waiting for more learns it)
            got = b""
            try:
                while chunk := await stream.read():
                    got += chunk
            except lattica.errors.LatticaError:
                pass  # (reset: the expected end)
            return got

        for wire in [
            hello + b"".join(encode(f"/nope/{i}") for i in range(MAX_PROPOSALS + 3)),
            hello + encode("ls") * 10,
            b"\xff\xff\xff\xff garbage",
            hello + encode("/ipfs/ping/1.0.0") + b"short",  # agreed; 5 bytes then end: no echo
        ]:
            got = peer.run(misbehave(wire), timeout=15)
            assert len(got) < 4096
        assert peer.ping(node.peer_id) > 0
        lattica.dht.bootstrap(node=peer).result(10)
