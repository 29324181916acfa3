"""``lattica.dht``: the mesh's shared memory for small facts.

Where a peer can be reached, who provides a content block, which shards serve which layers. Every
function returns a :class:`lattica.Future`: ``await`` it in async code, call ``.result()`` (or
``lattica.get``) in sync code. ``node=`` picks a node other than the one calls go through by
default (``lattica.init``'s, or the node whose actor is calling).

Keys are ``str`` (UTF-8) or ``bytes``; values are anything the codec encodes (up to 16 KiB
encoded by default). A subkey lets many writers share a key without overwriting each other; a
PeerId subkey, or a key made by :func:`owned_key`, can only be written by that peer.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from lattica import codec
from lattica._future import Future
from lattica._identity import PeerId
from lattica._remote import current_runtime
from lattica._runtime import run_coroutine
from lattica.dht._records import TOMBSTONE, Entry, decode_subkey, mesh_scoped
from lattica.dht._records import owned_key as _owned_key
from lattica.errors import LatticaError, NodeClosed

if TYPE_CHECKING:
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.dht import DhtService

__all__ = [
    "Value",
    "Record",
    "put",
    "get",
    "delete",
    "provide",
    "find_providers",
    "find_peer",
    "bootstrap",
    "owned_key",
    "mesh_scoped",
]


class Value(NamedTuple):
    value: Any
    expiration: float  # unix seconds


class Record(dict[Any, Value]):
    """What ``get`` returns: ``{subkey: Value}`` for every live subkey (``None`` is the subkey of
    a plain ``put``); ``record.value`` is that plain value."""

    @property
    def value(self) -> Any:
        v = self.get(None)
        return v.value if v is not None else None

    @property
    def expiration(self) -> float | None:
        v = self.get(None)
        return v.expiration if v is not None else None


def _key(key: str | bytes) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"DHT keys are str or bytes, not {type(key).__name__}")


def _runtime(node: Node | None) -> Runtime:
    if node is None:
        return current_runtime()
    host = node.host
    if host is None or host.runtime is None:
        raise NodeClosed("the node is not running")
    return host.runtime


def run_with_service(
    node: Node | None,
    make: Callable[[DhtService], Coroutine[Any, Any, Any]],
    convert: Callable[[Any], Any] | None = None,
) -> Future:
    rt = _runtime(node)
    return run_coroutine(rt, lambda: make(rt.host.services.dht), convert)


def put(key: str | bytes, value: Any, *, subkey: Any = None, ttl: float = 60.0, node: Node | None = None) -> Future:
    """Store ``value`` under ``key`` (and ``subkey``) on the k closest nodes for ``ttl`` seconds,
    re-published by this node until it expires. Resolves to how many replicas accepted it;
    fails with StoreFailed if none did (each refusal's reason is in the message)."""
    raw = _key(key)
    data = codec.encode_bytes(value)
    return run_with_service(node, lambda dht: dht.put(raw, data, subkey=subkey, ttl=ttl))


def _to_record(entries: dict[bytes, Entry]) -> Record | None:
    rec = Record()
    for sk, e in entries.items():
        if e.value == TOMBSTONE:
            continue
        try:
            rec[decode_subkey(sk)] = Value(codec.decode(e.value), e.expiration)
        except LatticaError:
            continue  # a writer's undecodable subkey or value hides only itself
    return rec or None


def get(key: str | bytes, *, quorum: int | None = None, node: Node | None = None) -> Future:
    """Every live subkey of ``key`` merged from its replicas, as a :class:`Record` (None when
    nothing is stored). ``quorum``: stop after that many replicas answered with records."""
    raw = _key(key)
    return run_with_service(node, lambda dht: dht.get(raw, quorum=quorum), _to_record)


def delete(key: str | bytes, *, subkey: Any = None, ttl: float = 60.0, node: Node | None = None) -> Future:
    """Hide a record: a tombstone that expires later wins over it on every replica."""
    raw = _key(key)
    return run_with_service(node, lambda dht: dht.delete(raw, subkey=subkey, ttl=ttl))


def provide(cid: str | bytes, *, ttl: float = 3600.0, node: Node | None = None) -> Future:
    """Announce that this node provides the content ``cid`` (re-announced until stopped)."""
    raw = _key(cid)
    return run_with_service(node, lambda dht: dht.provide(raw, ttl=ttl))


def find_providers(cid: str | bytes, *, count: int = 20, node: Node | None = None) -> Future:
    """Up to ``count`` PeerIds providing ``cid``; their addresses are remembered for dialing."""
    raw = _key(cid)
    return run_with_service(node, lambda dht: dht.find_providers(raw, count=count))


def find_peer(peer: PeerId | str, *, node: Node | None = None) -> Future:
    """The addresses of ``peer`` (from a live connection, else its signed peer record)."""
    pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
    return run_with_service(node, lambda dht: dht.find_peer(pid))


def bootstrap(*, node: Node | None = None) -> Future:
    """Join the DHT through the peers this node is connected to; resolves to the routing table size."""
    return run_with_service(node, lambda dht: dht.bootstrap())


def owned_key(name: str, owner: PeerId | None = None) -> str:
    """A key that only ``owner`` (default: this node) may write."""
    return _owned_key(name, owner if owner is not None else current_runtime().peer_id)
