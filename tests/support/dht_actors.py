"""Actors that drive the DHT from inside another node (its own process, its own default node)."""

import lattica


@lattica.actor
class DhtProbe:
    async def peer_id(self) -> lattica.PeerId:
        return _runtime().peer_id

    async def bootstrap(self) -> int:
        return await lattica.dht.bootstrap()

    async def put(self, key, value, subkey=None, ttl=60.0) -> int:
        return await lattica.dht.put(key, value, subkey=subkey, ttl=ttl)

    async def get(self, key):
        rec = await lattica.dht.get(key)
        return None if rec is None else {"" if k is None else str(k): v.value for k, v in rec.items()}

    async def provide(self, cid) -> int:
        return await lattica.dht.provide(cid)

    async def find_providers(self, cid) -> list:
        return await lattica.dht.find_providers(cid)

    async def find_peer(self, peer) -> list:
        return [str(a) for a in await lattica.dht.find_peer(peer)]

    async def call_named(self, name: str, method: str):
        ref = await lattica.aget_actor(name)
        return await getattr(ref, method).remote()


def _runtime():
    from lattica._remote import current_runtime

    return current_runtime()
