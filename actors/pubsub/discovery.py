"""How subscribers of a topic find each other (the pub-sub service's, ``lattica.actors.pubsub``):
through the DHT, each announces itself as a provider of the topic's key (``rendezvous``) and,
while it knows fewer than D_lo peers of the topic, looks the key up and connects to some of the
providers (by PeerId: direct, punched or relayed, as any dial). Mesh peers' connections are kept
open while idle.

Anyone may put provider records in the DHT, naming addresses of a third party: direct dials to
one IP address for topic providers are few (``DIALS_PER_IP``), and a provider we could not reach
is not tried again for ``FAILED_FOR``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from lattica._budget import Buckets
from lattica._interfaces import host_key, ip_of, is_loopback_ip
from lattica.dht._records import mesh_scoped
from lattica.errors import LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.calls import Calls
    from lattica.actors.dht import DhtService
    from lattica.config import PubSubConfig
    from lattica.pubsub._router import Router

log = get_logger("lattica.pubsub")

__all__ = ["Discovery", "topic_key"]

_TOPIC_DOMAIN = b"lattica pubsub topic\x00"
_PROVIDE_TTL = 1800.0  # of our provider record for a topic we joined (the DHT re-announces it)
_FIND_EVERY = (1.0, 60.0)  # first and longest wait between lookups while a topic's peers are few
_MESH_TAG = "pubsub mesh"
_FAILED_FOR = 600.0  # seconds a topic provider we could not reach is not tried again
_PEERS_MAX = 4096  # providers we could not reach, and IP addresses dialed, we keep
# direct dials to one IP address for topic providers: anyone may put provider records in the
# DHT, naming addresses of a third party; at most this many dials to it, then one per 30 s
_DIALS_PER_IP = (1 / 30, 2.0)


def topic_key(topic: str) -> bytes:
    """The DHT key under which a topic's subscribers announce themselves (sha2-256 multihash)."""
    import hashlib  # (a node that joins no topic does not load it)

    return b"\x12\x20" + hashlib.sha256(_TOPIC_DOMAIN + topic.encode()).digest()


class Discovery:
    """A node's topics' discovery (see the module docstring): ``start`` when it joins a topic,
    ``stop`` when it leaves; ``router()`` is the service's router, ``is_open`` tells the topics
    it opened to strangers."""

    def __init__(
        self,
        runtime: Calls,
        cfg: PubSubConfig,
        router: Callable[[], Router],
        is_open: Callable[[str], bool],
        dht: DhtService | None,
    ) -> None:
        self.rt = runtime
        self.dht = dht  # where a topic's subscribers meet (None: only peers connected otherwise)
        self.host = runtime.host
        self.cfg = cfg
        self._router = router
        self._is_open = is_open
        self._finding: dict[str, asyncio.Task] = {}  # topic -> its discovery (``_discover``)
        self._protected: set[PeerId] = set()  # mesh peers whose idle connections we keep
        self._failed: dict[PeerId, float] = {}  # topic providers we could not reach: when
        self._dials = Buckets(*_DIALS_PER_IP, _PEERS_MAX)
        self._closed = False

    def start(self, topic: str) -> None:
        """We joined ``topic``: announce ourselves and find its peers (unless ``discover`` is off)."""
        if self.cfg.discover and topic not in self._finding:
            self._finding[topic] = self.host.spawn(self._discover(topic))

    def stop(self, topic: str) -> None:
        """We left ``topic``: no more lookups, nor our provider record."""
        task = self._finding.pop(topic, None)
        if task is not None:
            task.cancel()
        dht = self.dht
        if dht is not None:
            dht.stop_providing(self.rendezvous(topic))

    def rendezvous(self, topic: str) -> bytes:
        """The DHT key a topic's subscribers meet under: in a mesh (of a key) a closed topic's is
        scoped to it, so only its members' provider records are kept there; an open topic's, or
        any in a mesh of listed PeerIds, is the plain ``topic_key`` (providers ranked members first)."""
        key = topic_key(topic)
        cert = None if self._is_open(topic) else self.host.trust.certificate(time.time())
        return key if cert is None else mesh_scoped(key, cert.mesh)

    async def _discover(self, topic: str) -> None:
        """Announce ourselves under the topic's key, and while we know fewer than D_lo of its
        peers, look the key up and connect to providers we are not connected to (up to D)."""
        dht = self.dht
        if dht is None:
            return
        key = self.rendezvous(topic)
        provided = False
        wait = _FIND_EVERY[0]
        while not self._closed:
            if not provided:
                try:
                    provided = await dht.provide(key, ttl=_PROVIDE_TTL) > 0
                except (TimeoutError, LatticaError) as e:
                    log.debug("pub-sub topic not announced yet", topic=topic, reason=str(e))
            known = len(self._router().topics.get(topic, ()))
            if known < self.cfg.d_lo:
                try:
                    found = await dht.find_providers(key, count=20)
                except (TimeoutError, LatticaError) as e:
                    log.debug("pub-sub topic lookup failed", topic=topic, reason=str(e))
                    found = []
                now = self.host.loop.time()
                fresh = [
                    p
                    for p in found
                    if p != self.rt.peer_id
                    and p not in self.host.conns
                    and now - self._failed.get(p, -_FAILED_FOR) >= _FAILED_FOR
                ]
                fresh = fresh[: max(self.cfg.d - known, 0)]
                await asyncio.gather(*(self._connect(p) for p in fresh))
                wait = min(wait * 2, _FIND_EVERY[1])
            else:
                wait = _FIND_EVERY[1]
            await asyncio.sleep(wait if provided else min(wait, 5.0))

    async def _connect(self, peer: PeerId) -> None:
        """Dial a topic provider, unless a direct address it names has had its dials (circuits
        are the relays' to check); one we cannot reach is left alone for ``_FAILED_FOR``."""
        ips = {
            host_key(ip)
            for a in self.host.peer_addrs.get(peer, ())
            if (ip := ip_of(a)) is not None and not is_loopback_ip(ip)
        }
        if not all([self._dials.take(ip) for ip in ips]):
            log.debug("pub-sub topic peer not dialed: its address had its dials", peer=str(peer))
            return
        try:
            await self.host.get_connection(peer)
        except (TimeoutError, LatticaError, OSError) as e:
            log.debug("pub-sub topic peer not reached", peer=str(peer), reason=str(e))
            if len(self._failed) >= _PEERS_MAX:
                self._failed.pop(next(iter(self._failed)))
            self._failed[peer] = self.host.loop.time()

    def keep_mesh_connections(self) -> None:
        """Mesh peers' connections stay open while idle; others are the connection manager's."""
        # (the router keeps the PeerIds we give it as hashables)
        meshes = self._router().mesh
        mesh = cast("set[PeerId]", set().union(*meshes.values()) if meshes else set())
        for peer in mesh - self._protected:
            self.host.protect(peer, _MESH_TAG)
        for peer in self._protected - mesh:
            self.host.unprotect(peer, _MESH_TAG)
        self._protected = mesh

    def close(self) -> None:
        self._closed = True
        for task in self._finding.values():
            task.cancel()
        self._finding.clear()
