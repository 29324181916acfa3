"""Our libp2p Kademlia with go-libp2p-kad-dht v0.25.1 (p2pd ``-dhtServer``) on ``/ipfs/kad/1.0.0``
(issue 49), on 127.0.0.1: go admits us to its routing table, provider records travel both ways,
a FIND_NODE lookup goes through a small go DHT, and ``/pk/`` values go both ways."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.p2pd import Daemon, daemon
from lattica.config import IPFS_KAD
from lattica.content._cid import Cid

pytestmark = pytest.mark.timeout(90)


def _cid(data: bytes) -> bytes:
    """The binary CIDv1 of ``data`` as a raw block (go's provide takes a CID; the DHT key is
    its multihash, ``cid[2:]``)."""
    return bytes([0x01, 0x55, 0x12, 0x20]) + hashlib.sha256(data).digest()


async def _until(cond, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _go_knows(d: Daemon, peer: lattica.PeerId) -> bool:
    """``peer`` is in go's routing table: its closest peers to ``peer`` include it."""
    with contextlib.suppress(RuntimeError):
        return peer in await d.dht_closest_peers(peer.to_bytes(), timeout=2)
    return False


async def _provides(d: Daemon, cid: bytes, peer: lattica.PeerId) -> bool:
    with contextlib.suppress(RuntimeError):
        return peer in dict(await d.dht_find_providers(cid, timeout=2))
    return False


def test_ours_and_a_go_dht(p2pd_binary):
    with (
        daemon(p2pd_binary, dht_server=True) as a,
        daemon(p2pd_binary, dht_server=True) as b,
        lattica.Node(membership=False, pubsub=False, crdt=False) as node,
    ):
        kad = host_of(node).services.kad[IPFS_KAD]  # type: ignore[union-attr]

        async def run() -> None:
            (pa, _), (pb, addrs_b) = await a.identify(), await b.identify()
            # a small go DHT (a - b), and us connected to a only: we learn of b through it
            await a.connect(pb, addrs_b)
            await a.connect(node.peer_id, [x.without_peer_id() for x in node.addrs])
            await _until(lambda: _go_knows(a, node.peer_id), "go never admitted us to its table")
            await _until(lambda: asyncio.sleep(0, pa in kad.table), "a never entered our table")

            # FIND_NODE through go: b's addresses, from a's answer
            found = await kad.find_peer(pb)
            assert set(map(str, found)) & set(map(str, addrs_b)), (found, addrs_b)
            assert pb in await kad.closest_peers(pb.to_bytes())
            await _until(lambda: _go_knows(b, node.peer_id), "b never learned of us through the DHT", 15)

            # providers: ours found by go's b; go's a found by us
            ours = _cid(b"provided by lattica")
            assert await kad.provide(ours[2:]) >= 1
            providers = dict(await b.dht_find_providers(ours, timeout=5))
            assert node.peer_id in providers and providers[node.peer_id], providers
            theirs = _cid(b"provided by go")
            await a.dht_provide(theirs, timeout=5)
            got = await kad.find_providers(theirs[2:])
            assert pa in [p.peer for p in got] and next(p for p in got if p.peer == pa).addrs

            # what we publish is announced in IPFS's DHT too (the table reaches go nodes)
            assert kad.reaches_libp2p()
            cid = await lattica.content.put(b"published by lattica", node=node)
            published = Cid.parse(cid).bytes
            await _until(
                lambda: _provides(b, published, node.peer_id), "go never found our published content's provider"
            )

            # /pk/ values: go validates ours, we validate go's
            key = b"/pk/" + node.peer_id.to_bytes()
            assert await kad.put_value(key, node.peer_id.to_bytes()[2:]) >= 1
            assert await b.dht_get_value(key, timeout=5) == node.peer_id.to_bytes()[2:]
            go_key = b"/pk/" + pb.to_bytes()
            await b.dht_put_value(go_key, pb.to_bytes()[2:], timeout=5)
            assert await kad.get_value(go_key) == pb.to_bytes()[2:]

        node.run(run(), timeout=60)
