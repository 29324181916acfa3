"""The p2pd driver's DHT methods against go itself (issue 49): three go-libp2p-kad-dht v0.25.1
servers (``-dhtServer``) on 127.0.0.1, connected as a chain A - B - C, so that C knows of A only
through the DHT. This checks the driver (the daemon's DHT control messages, its single and
streamed answers, its errors) before the driver is used to check our Kademlia."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

import pytest

from lattica.bench._peers.p2pd import Daemon, daemon

pytestmark = pytest.mark.timeout(60)


def _cid(data: bytes) -> bytes:
    """The binary CIDv1 of ``data`` as a raw block: version 1, codec raw (0x55), sha2-256."""
    return bytes([0x01, 0x55, 0x12, 0x20]) + hashlib.sha256(data).digest()


async def _table_filled(d: Daemon, deadline: float) -> None:
    """Wait until ``d``'s routing table holds a peer, polling: go admits one after identify
    lists /ipfs/kad/1.0.0 and the peer answers a FIND_NODE for its own id (go's lookupCheck; an
    empty answer passes while the table is under 20 peers). Until then a lookup is refused with
    'failed to find any peer in table'. Between p2pds this takes some 20-60 ms."""
    while True:
        with contextlib.suppress(RuntimeError):
            if await d.dht_closest_peers(b"any key", timeout=1):
                return
        if time.monotonic() > deadline:
            raise AssertionError("go's routing table stayed empty")
        await asyncio.sleep(0.02)


async def _scenario(a: Daemon, b: Daemon, c: Daemon) -> None:
    (pa, addrs_a), (pb, addrs_b), (pc, _) = [await d.identify() for d in (a, b, c)]
    await a.connect(pb, addrs_b)
    await c.connect(pb, addrs_b)
    deadline = time.monotonic() + 10
    for d in (a, b, c):
        await _table_filled(d, deadline)

    # Peer routing. Filling C's table already connected C to A (go refreshes it, dialing whom B
    # named), and go answers FIND_PEER for a connected peer from its peerstore: cut that
    # connection so C's answer comes from a lookup.
    await c.disconnect(pa)
    found = await c.dht_find_peer(pa, timeout=5)
    assert set(found) & set(addrs_a), (found, addrs_a)
    assert {pa, pb} <= set(await c.dht_closest_peers(pa.to_bytes(), timeout=5))
    assert pc not in await c.dht_closest_peers(pa.to_bytes(), timeout=5)  # (go leaves itself out)

    # Provider records: A announces a CID, C finds A among its providers with A's addresses.
    cid = _cid(b"lattica issue 49")
    await a.dht_provide(cid, timeout=5)
    providers = dict(await c.dht_find_providers(cid, timeout=5))
    assert pa in providers and set(providers[pa]) & set(addrs_a), providers
    assert await c.dht_find_providers(_cid(b"nobody has this"), timeout=2) == []  # (a stream of BEGIN, END)

    # Values: go's default validators take /pk/<peer id multihash> -> that peer's public key
    # protobuf (for an Ed25519 id, inlined in the id: the identity multihash's digest) and /ipns/.
    key, public_key = b"/pk/" + pa.to_bytes(), pa.to_bytes()[2:]
    assert pa.public_key() is not None  # (go made an Ed25519 id, its key inlined)
    await a.dht_put_value(key, public_key, timeout=5)
    assert await c.dht_get_value(key, timeout=5) == public_key
    with pytest.raises(RuntimeError, match="invalid record keytype"):
        await a.dht_put_value(b"/lattica/x", b"v", timeout=2)
    with pytest.raises(RuntimeError, match="public key does not match storage key"):
        await a.dht_put_value(b"/pk/" + pb.to_bytes(), public_key, timeout=2)
    with pytest.raises(RuntimeError, match="not found"):
        await c.dht_get_value(b"/pk/" + pb.to_bytes(), timeout=2)


def test_go_dht_driver_chain_of_three(p2pd_binary):
    with (
        daemon(p2pd_binary, dht_server=True) as a,
        daemon(p2pd_binary, dht_server=True) as b,
        daemon(p2pd_binary, dht_server=True) as c,
    ):
        asyncio.run(asyncio.wait_for(_scenario(a, b, c), 30))
