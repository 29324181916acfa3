"""libp2p Kademlia between Lattica nodes (issue 49): every node is in the IPFS network and in the
one its protocol_version names, on real sockets; each test asks one node's KadNetwork through
its loop. Interop with go and rust is in tests/interop/."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from lattica import Node
from lattica.actors.dht.libp2p import KadNetwork
from lattica.bench import host_of
from lattica.config import IPFS_KAD, KadConfig
from lattica.dht._kademlia import key_id
from lattica.errors import DhtError, PeerNotFound

SDK_NET = "/lattica/1.0.0"


def on_loop(node: Node, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, host_of(node).loop).result(timeout)


def kad(node: Node, protocol: str = IPFS_KAD) -> KadNetwork:
    services = host_of(node).services
    assert services.kad is not None
    return services.kad[protocol]


def wait_for(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def multihash(data: bytes) -> bytes:
    return b"\x12\x20" + hashlib.sha256(data).digest()


@pytest.fixture
def line():
    """Three nodes in a line, a - b - c: a and c know each other only through b's table."""
    nodes = [Node(membership=False, pubsub=False, crdt=False).start() for _ in range(3)]
    a, b, c = nodes
    a.connect(b.addrs)
    c.connect(b.addrs)
    for n in nodes:
        wait_for(lambda n=n: len(kad(n).table) >= (2 if n is b else 1))
    yield a, b, c
    for n in nodes:
        n.stop()


def test_lattica_nodes_are_in_both_tables(line) -> None:
    a, b, c = line
    for proto in (IPFS_KAD, SDK_NET):
        assert a.peer_id in kad(b, proto).table and c.peer_id in kad(b, proto).table
    assert IPFS_KAD in host_of(a).handlers and SDK_NET in host_of(a).handlers


def test_providers_found_through_a_third_node(line) -> None:
    a, b, c = line
    key = multihash(b"some content")
    assert on_loop(a, kad(a).provide(key)) >= 1
    found = on_loop(c, kad(c).find_providers(key))
    assert [p.peer for p in found] == [a.peer_id]
    assert found[0].addrs, "a provider comes with the addresses to dial it"


def test_find_peer_and_closest(line) -> None:
    a, b, c = line
    addrs = on_loop(c, kad(c).find_peer(a.peer_id))
    assert {str(x) for x in addrs} & {str(x.without_peer_id()) for x in a.addrs}
    closest = on_loop(c, kad(c).closest_peers(a.peer_id.to_bytes()))
    assert closest[0] == a.peer_id
    with pytest.raises(PeerNotFound):
        on_loop(c, kad(c).find_peer(Node(membership=False).peer_id))


def test_opaque_values_on_an_sdk_network(line) -> None:
    a, b, c = line
    assert on_loop(a, kad(a, SDK_NET).put_value(b"some-key", b"\x00bytes")) >= 2
    assert on_loop(c, kad(c, SDK_NET).get_value(b"some-key")) == b"\x00bytes"
    with pytest.raises(DhtError):
        on_loop(c, kad(c, SDK_NET).get_value(b"no-such-key"))


def test_ipfs_network_refuses_values_outside_its_namespaces(line) -> None:
    a, _, _ = line
    from lattica.errors import RecordRejected  # (the refusal is local: nothing is sent)

    with pytest.raises(RecordRejected):
        on_loop(a, kad(a).put_value(b"/other/key", b"value"))


def test_networks_and_client_mode_are_configurable() -> None:
    n = Node(kad=KadConfig(networks=("/my/kad",), server=False), membership=False).start()
    try:
        assert [k.protocol for k in host_of(n).services.kad] == ["/my/kad"]
        assert "/my/kad" not in host_of(n).handlers and IPFS_KAD not in host_of(n).handlers
    finally:
        n.stop()
    off = Node(kad=False, membership=False).start()
    try:
        assert host_of(off).services.kad is None
    finally:
        off.stop()


def test_the_public_api_as_a_user_types_it(line) -> None:
    """``lattica.kad`` with a CID, from a plain thread: Futures resolved with ``.result()``."""
    import lattica

    a, b, c = line
    cid = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert lattica.kad.networks(node=a) == [IPFS_KAD, SDK_NET]
    assert lattica.kad.provide(cid, node=a).result(10) >= 1
    found = lattica.kad.find_providers(cid, node=c).result(10)
    assert found[0].peer == a.peer_id and found[0].addrs
    assert lattica.kad.put("k", b"v", network=SDK_NET, node=a).result(10) >= 1
    assert lattica.kad.get("k", network=SDK_NET, node=c).result(10) == b"v"
    assert lattica.kad.find_peer(str(a.peer_id), node=c).result(10)
    assert lattica.kad.closest_peers(a.peer_id, node=c).result(10)[0] == a.peer_id


def test_bucket_refresh_keys_land_in_their_buckets(line) -> None:
    """libp2p keys are hashed by the receiver, so a refresh key is a pre-image whose id falls in
    the stale bucket: found by trying for the 14 farthest buckets, not for nearer ones."""
    a, _, _ = line
    net = kad(a)
    for index in (255, 250, 243):
        key = net._key_in_bucket(index)
        assert key is not None and net.table.bucket_index(key_id(key)) == index
    assert net._key_in_bucket(100) is None
    before = len(net.stats)
    on_loop(a, net.refresh(force=True))
    kinds = [s.kind for s in list(net.stats)[before:]]
    assert "refresh" in kinds, kinds  # (and the bootstrap the network's first use starts)
