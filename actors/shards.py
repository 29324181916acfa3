"""The ``shards`` service: this node's actors that serve shards of a service, registered in the
DHT while they live, and the providers of a shard as the DHT knows them (docs/shards.md).

Each node keeps one record per shard it serves (``lattica/shard/<service>/<shard id>``, within its
mesh: the key scoped by the mesh's admission key, the node's certificate of that mesh as subkey,
so only members write there and only it signs its record; a node in no mesh or an open one uses
the plain key, subkey its PeerId): its actors serving the shard, each with its load (calls
running and waiting), and its mesh certificates. It is put again every ``name_ttl`` / 3 with the loads of then,
replaced by a tombstone when the last of those actors ends, and expires within ``name_ttl`` if the
node dies. Reading, a node takes the records of members only (a stranger could register anything),
of nodes membership does not hold dead, and for actors on the node that signed the record.

The ``shards`` system actor answers ``check``: whether an actor here serves a shard now (a stub
asks before its first call to a provider: a registration that outlived a change of what the actor
serves is found out, not followed); and ``serve``, for the node that spawned an actor here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lattica._budget import Buckets
from lattica._identity import PeerId
from lattica._runtime import ActorRef, current_caller
from lattica.actors.dht.upkeep import NAME_GRACE
from lattica.dht._records import TOMBSTONE, mesh_scoped
from lattica.errors import ActorNotFound, LatticaError, PermissionDenied, ProtocolError
from lattica.logging import get_logger
from lattica.shards._keys import MAX_PROVIDERS_PER_NODE, decode_registration, encode_registration, shard_id, shard_key
from lattica.trust import Certificate, CertificateError

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.dht import DhtService
    from lattica.actors.spawner import Spawner

__all__ = ["ShardsService", "ShardsActor"]

log = get_logger("lattica.shards")

MAX_SHARDS = 1024  # (service, shard) pairs one node serves
MAX_PER_OWNER = 64  # registrations of actors another node spawned here, per such node
MAX_RECORD = 16 * 1024 - 256  # a record's bytes (the DHT stores values up to 16 KiB)
VERDICT_TTL = 60.0  # s a judgement of a registering node's certificates is kept


class ShardsService:
    """See the module docstring."""

    def __init__(self, runtime: Calls, dht: DhtService, spawner: Spawner) -> None:
        self.rt = runtime
        self.dht = dht  # where registrations are published and found
        self.owners = spawner.owners  # which node spawned each of our actors (it says what they serve)
        self._served: dict[bytes, dict[str, ActorRef]] = {}  # shard key -> our actors serving it, by name
        self._published: dict[bytes, bytes] = {}  # shard key -> the DHT key our record is kept under
        self._verdicts: dict[tuple[bytes, bytes], tuple[float, bool]] = {}  # (peer, certs) -> (when, a stranger?)
        runtime.stop_listeners.append(self._ended)

    # -- serving -------------------------------------------------------------------------------

    def serve(self, ref: ActorRef, service: str, shard: str | Mapping[str, Any], owner: PeerId | None = None) -> Any:
        """Register ``ref`` (an actor of this node) as a provider of ``shard`` of ``service`` (for
        ``owner``, the node that spawned it here, if not this one); the task of the first put."""
        key = shard_key(service, shard)
        if ref.peer_id != self.rt.peer_id or ref.name not in self.rt.actors:
            raise ActorNotFound(f"{ref.name!r} is not an actor of this node: only a node's own actors serve from it")
        actors = self._served.get(key, {})
        if ref.name in actors:
            return self._publish(key)  # (already: published again)
        if key not in self._served and len(self._served) >= MAX_SHARDS:
            raise ValueError(f"this node serves {MAX_SHARDS} shards already")
        if owner is not None:
            mine = sum(1 for a in self._served.values() for name in a if self.owners.get(name) == owner)
            if mine >= MAX_PER_OWNER:
                raise ValueError(f"{owner} has {MAX_PER_OWNER} registrations of its actors on this node already")
        if len(actors) >= MAX_PROVIDERS_PER_NODE:
            raise ValueError(f"{MAX_PROVIDERS_PER_NODE} actors of this node serve {shard_id(shard)!r} already")
        actors = dict(actors)
        actors[ref.name] = self.rt.actors[ref.name].ref
        if len(encode_registration([(r, 0) for r in actors.values()], self.rt.host.trust.presented)) > MAX_RECORD:
            raise ValueError(
                f"the registration of {shard_id(shard)!r} would not fit a DHT record (16 KiB): fewer actors, or fewer methods"
            )
        self._served[key] = actors
        return self._publish(key)

    def withdraw(self, ref: ActorRef, service: str, shard: str | Mapping[str, Any]) -> None:
        """``ref`` no longer serves ``shard`` of ``service`` (a no-op if it did not)."""
        key = shard_key(service, shard)
        actors = self._served.get(key)
        if actors is not None and actors.pop(ref.name, None) is not None:
            self._publish(key)

    def serving(self, key: bytes, name: str) -> bool:
        return name in self._served.get(key, ())

    def _ended(self, name: str, reason: str) -> None:
        for key in [k for k, actors in self._served.items() if name in actors]:
            del self._served[key][name]
            self._publish(key)

    def _publish(self, key: bytes) -> Any:
        """Put our record of ``key`` now (and keep it fresh), or withdraw it if none of ours
        serves it; the task of the put (None for a withdrawal)."""
        dht = self.dht
        if not self._served.get(key):
            self._served.pop(key, None)
            dht.drop_live(self._published.pop(key, key))
            return None
        cert = self._membership()
        where = key if cert is None else mesh_scoped(key, cert.mesh)
        old = self._published.get(key)
        if old is not None and old != where:
            dht.drop_live(old)  # (our mesh changed)
        self._published[key] = where
        return dht.keep_live(where, lambda: self._record(key), subkey=cert)

    def _membership(self) -> Certificate | None:
        """Our certificate of the mesh our shards live in (the first mesh we belong to), or None
        in no mesh or an open one (then the plain keys)."""
        return self.rt.host.trust.certificate(time.time())

    def _record(self, key: bytes) -> bytes:
        entries = []
        for name, ref in self._served.get(key, {}).items():
            actor = self.rt.actors.get(name)
            load = len(actor.live) + len(actor.waiting) if actor is not None else 0
            entries.append((ref, load))
        return encode_registration(entries, self.rt.host.trust.presented)

    # -- finding -------------------------------------------------------------------------------

    async def providers(
        self, service: str, shard: str | Mapping[str, Any], everywhere: bool = False
    ) -> list[tuple[ActorRef, int]]:
        """The actors serving ``shard`` of ``service`` with their registered loads: from the first
        DHT node that holds the key (``everywhere``: from every one; also when the first held
        none we may follow)."""
        key = shard_key(service, shard)
        cert = self._membership()
        if cert is not None:
            key = mesh_scoped(key, cert.mesh)
        dht = self.dht
        found = await dht.get(key, quorum=None if everywhere else 1, grace=NAME_GRACE)
        out = self._usable(found)
        if not out and found and not everywhere:
            out = self._usable(await dht.get(key, grace=NAME_GRACE))
        return out

    def _usable(self, records: Mapping[bytes, Any]) -> list[tuple[ActorRef, int]]:
        now = time.time()
        out: list[tuple[ActorRef, int]] = []
        for sk, entry in records.items():
            if entry.value == TOMBSTONE or sk[:1] not in (b"p", b"c"):
                continue
            try:  # (a certificate subkey was verified on the way: it names the record's signer)
                peer = PeerId.from_bytes(sk[1:]) if sk[:1] == b"p" else Certificate.from_bytes(sk[1:]).peer
                entries, certs = decode_registration(entry.value)
            except (LatticaError, CertificateError, ValueError):
                continue
            if self._stranger(peer, certs, now) or self.rt.node_gone(peer):
                continue
            # a node registers its own actors only; and a plain ref (a stable one would follow
            # wherever its registrant's chosen supervisor says)
            out += [
                (ActorRef(ref.peer_id, ref.name, ref.methods, ref.window), load)
                for ref, load in entries
                if ref.peer_id == peer
            ]
        return out

    def _stranger(self, peer: PeerId, certs: list[bytes], now: float) -> bool:
        """Whether ``peer`` is a stranger to our mesh by ``certs`` (kept a while: a stranger's
        records would otherwise cost a certificate check each per lookup)."""
        key = (peer.to_bytes(), b"".join(len(c).to_bytes(2, "big") + c for c in certs[:8]))
        seen = self._verdicts.get(key)
        if seen is not None and now - seen[0] < VERDICT_TTL:
            return seen[1]
        if len(self._verdicts) >= 4096:
            self._verdicts.clear()
        stranger = self.rt.host.trust.judge(peer, certs, now)[0] == "stranger"
        self._verdicts[key] = (now, stranger)
        return stranger

    def close(self) -> None:
        for key in list(self._served):
            self.dht.drop_live(self._published.get(key, key))
        self._served.clear()
        self._published.clear()


class ShardsActor:
    """What other nodes ask the ``shards`` service (members only)."""

    NAME = "shards"

    def __init__(self, service: ShardsService) -> None:
        self._s = service
        self._calls = Buckets(5.0, 20.0, 1024)  # serve calls each node may make of us

    async def serve(self, actor: str, service: str, shard: str) -> None:
        """Register our actor ``actor`` as a provider of ``shard`` of ``service``, for the node
        that spawned it here (only its owner may say what it serves)."""
        caller = current_caller()
        rt = self._s.rt
        if type(actor) is not str or actor not in rt.actors:
            raise ActorNotFound(f"no actor {actor!r} on {rt.peer_id}")
        owner = self._s.owners.get(actor)
        if caller is not None and caller != rt.peer_id and caller != owner:
            raise PermissionDenied(f"only the node that spawned {actor!r} says what it serves")
        if caller is not None and not self._calls.take(caller):
            raise PermissionDenied(f"{caller} registers shards on {rt.peer_id} too often")
        try:
            put = self._s.serve(rt.actors[actor].ref, service, shard, owner)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if put is not None:
            await put  # (registered once it is stored: a lookup right after finds it)

    async def withdraw(self, actor: str, service: str, shard: str) -> None:
        """``actor`` here no longer serves ``shard`` of ``service`` (its spawning node asks)."""
        caller = current_caller()
        rt = self._s.rt
        if (
            type(actor) is not str
            or caller is not None
            and caller != rt.peer_id
            and caller != self._s.owners.get(actor)
        ):
            raise PermissionDenied(f"only the node that spawned {actor!r} says what it serves")
        if actor in rt.actors:
            self._s.withdraw(rt.actors[actor].ref, service, shard)

    async def check(self, service: str, shard: str, actor: str) -> bool:
        """Whether ``actor`` here serves ``shard`` of ``service`` now."""
        if type(service) is not str or type(shard) is not str or type(actor) is not str:
            return False
        try:
            key = shard_key(service, shard)
        except ValueError:
            return False
        return self._s.serving(key, actor)
