"""What peers may call: the ``dht`` system actor (:class:`DhtActor`), the protocol's fixed method
table (:func:`dht_ref`) and the size limits of its answers."""

from __future__ import annotations

from typing import Protocol

from lattica._identity import PeerId
from lattica._runtime import ASYNC, ActorRef
from lattica.config import DhtConfig
from lattica.dht._kademlia import K, RoutingTable, key_id, node_id
from lattica.dht._records import PeerRecord, RecordStore, entry_from_wire, entry_to_wire
from lattica.errors import RecordRejected

RPC_METHODS = (
    "ping",
    "find_node",
    "find_value",
    "store",
    "add_provider",
    "get_providers",
    "put_peer_record",
    "get_peer_record",
)
MAX_PEERS_IN_ANSWER = 2 * K
MAX_ADDRS_IN_ANSWER = 8


def dht_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s DHT actor (its method table is fixed by the protocol)."""
    return ActorRef(peer, "dht", {m: ASYNC for m in RPC_METHODS})


class LocalDht(Protocol):
    """The part of the node's DHT the actor answers from (a :class:`DhtService`)."""

    cfg: DhtConfig
    table: RoutingTable
    store: RecordStore
    rejected: int  # stores we refused

    def caller_seen(self) -> PeerId: ...

    def peers_wire(self, peers: list[PeerId], to: PeerId | None = None) -> list: ...


class DhtActor:
    """What peers may call. Every method answers from local state only (no lookups on a peer's
    behalf) and records the caller in the routing table when it is dialable."""

    NAME = "dht"

    def __init__(self, service: LocalDht) -> None:
        self._svc = service

    async def ping(self) -> bool:
        self._svc.caller_seen()
        return True

    async def find_node(self, target: bytes) -> list:
        svc = self._svc
        caller = svc.caller_seen()
        if type(target) is not bytes or len(target) != 32:
            raise ValueError("find_node takes a 32-byte id")
        return svc.peers_wire(svc.table.closest(int.from_bytes(target, "big"), svc.cfg.k, exclude=caller), caller)

    async def find_value(self, kid: bytes) -> list:
        svc = self._svc
        caller = svc.caller_seen()
        if type(kid) is not bytes or len(kid) != 32:
            raise ValueError("find_value takes a 32-byte key id")
        target = int.from_bytes(kid, "big")
        held = svc.store.get(target)
        records = [entry_to_wire(sk, e) for sk, e in held[1].items()] if held else []
        return [records, svc.peers_wire(svc.table.closest(target, svc.cfg.k, exclude=caller), caller)]

    async def store(self, key: bytes, record: list) -> bool:
        """Merge one record; raises RecordRejected with the reason when refused."""
        svc = self._svc
        caller = svc.caller_seen()
        try:
            svc.store.admit(caller)
            sk, entry = entry_from_wire(record)
            return svc.store.put(key, sk, entry, caller)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def add_provider(self, cid: bytes, ttl: float, cert: bytes = b"") -> None:
        """The caller provides ``cid`` (under a mesh-scoped key: ``cert``, its certificate of the mesh)."""
        svc = self._svc
        caller = svc.caller_seen()
        try:
            svc.store.admit(caller)
            svc.store.add_provider(cid, caller, ttl, cert)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def get_providers(self, cid: bytes) -> list:
        svc = self._svc
        caller = svc.caller_seen()
        if type(cid) is not bytes or not 0 < len(cid) <= svc.cfg.limits.max_key:
            raise ValueError("get_providers takes a content id (bytes)")
        provs = svc.peers_wire(svc.store.ranked_providers(cid)[:MAX_PEERS_IN_ANSWER], caller)
        closer = svc.table.closest(key_id(cid), svc.cfg.k, exclude=caller)
        # members of our mesh come first; how many, so an asker of our mesh can rank them first too
        members = next((i for i, (p, _) in enumerate(provs) if svc.store.is_stranger(p)), len(provs))
        return [provs, svc.peers_wire(closer, caller), members]

    async def put_peer_record(self, record: list) -> bool:
        svc = self._svc
        caller = svc.caller_seen()
        try:
            svc.store.admit(caller)
            return svc.store.put_peer_record(PeerRecord.from_wire(record, svc.cfg.limits), caller)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def get_peer_record(self, peer: PeerId) -> list:
        svc = self._svc
        caller = svc.caller_seen()
        if not isinstance(peer, PeerId):
            raise ValueError("get_peer_record takes a PeerId")
        rec = svc.store.peer_record(peer)
        closer = svc.table.closest(node_id(peer), svc.cfg.k, exclude=caller)
        return [rec.to_wire() if rec is not None else None, svc.peers_wire(closer, caller)]
