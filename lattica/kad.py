"""``lattica.kad``: the libp2p Kademlia networks a node is in, beside the mesh's own DHT
(``lattica.dht``): IPFS's (``/ipfs/kad/1.0.0``, the default here) and a Lattica SDK swarm's,
whose protocol id is its identify ``protocolVersion`` (``/lattica/1.0.0`` unless configured).

Every function returns a :class:`lattica.Future` (``await`` it, or ``.result()``); ``network=``
picks the protocol id, ``node=`` a node other than the default one. Values are bytes, judged by
the network's validators: IPFS's takes only ``/pk/`` and ``/ipns/`` records; other networks take
any value up to 10 KiB. Which networks a node joins: ``Node(kad=KadConfig(networks=...))``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from lattica._future import Future
from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._remote import current_runtime
from lattica._runtime import run_coroutine
from lattica.config import IPFS_KAD
from lattica.content._cid import Cid
from lattica.errors import NodeClosed

if TYPE_CHECKING:
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.dht.libp2p import KadNetwork

__all__ = ["IPFS", "Provider", "provide", "find_providers", "find_peer", "closest_peers", "put", "get", "networks"]

IPFS = IPFS_KAD


class Provider(NamedTuple):
    peer: PeerId
    addrs: list[Multiaddr]


def _runtime(node: Node | None) -> Runtime:
    if node is None:
        return current_runtime()
    if node.host is None or node.host.runtime is None:
        raise NodeClosed("the node is not running")
    return node.host.runtime


def _run(
    node: Node | None,
    network: str,
    make: Callable[[KadNetwork], Coroutine[Any, Any, Any]],
    convert: Callable[[Any], Any] | None = None,
) -> Future:
    """``make(network)`` on the node's loop, as a Future."""
    rt = _runtime(node)
    kad = rt.host.services.kad
    if kad is None:
        raise NodeClosed("this node runs no libp2p Kademlia (it was started with kad=False)")
    net = kad[network]
    return run_coroutine(rt, lambda: make(net), convert)


def _multihash(cid: str | bytes | Cid) -> bytes:
    """The DHT key of a CID's providers: its multihash (IPFS's rule; raw and dag-pb CIDs of the
    same bytes share it)."""
    return Cid.parse(cid).bytes[-34:]


def provide(cid: str | bytes | Cid, *, network: str = IPFS, node: Node | None = None) -> Future:
    """Announce this node as a provider of ``cid`` to the peers closest to it (re-announced every
    22 h, as IPFS does); resolves to how many peers were told."""
    key = _multihash(cid)
    return _run(node, network, lambda net: net.provide(key))


def find_providers(cid: str | bytes | Cid, *, count: int = 20, network: str = IPFS, node: Node | None = None) -> Future:
    """Up to ``count`` providers of ``cid``, as :class:`Provider` (PeerId and addresses)."""
    key = _multihash(cid)
    return _run(
        node,
        network,
        lambda net: net.find_providers(key, count),
        lambda found: [Provider(p.peer, list(p.addrs)) for p in found],
    )


def find_peer(peer: PeerId | str, *, network: str = IPFS, node: Node | None = None) -> Future:
    """Where ``peer`` listens, as the network's peers closest to it say (PeerNotFound if none knows)."""
    pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
    return _run(node, network, lambda net: net.find_peer(pid))


def closest_peers(key: bytes | PeerId, *, network: str = IPFS, node: Node | None = None) -> Future:
    """The k peers of the network closest to ``key`` (a PeerId, or any bytes)."""
    raw = key.to_bytes() if isinstance(key, PeerId) else bytes(key)
    return _run(node, network, lambda net: net.closest_peers(raw))


def put(key: bytes | str, value: bytes, *, network: str = IPFS, node: Node | None = None) -> Future:
    """Store ``value`` under ``key`` on the k closest peers (re-put every 22 h); resolves to how
    many took it. RecordRejected if the network's validator refuses it, StoreFailed if no peer did."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    data = bytes(value)
    return _run(node, network, lambda net: net.put_value(raw, data))


def get(key: bytes | str, *, quorum: int = 1, network: str = IPFS, node: Node | None = None) -> Future:
    """The best valid value under ``key`` once ``quorum`` peers gave one (DhtError if none did)."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return _run(node, network, lambda net: net.get_value(raw, quorum))


def networks(*, node: Node | None = None) -> list[str]:
    """The protocol ids of the Kademlia networks the node is in."""
    kad = _runtime(node).host.services.kad
    return [] if kad is None else [n.protocol for n in kad]
