"""The ``sdk_swarm`` service (``Node(sdk=...)``, docs/sdk.md): the GossipSub topic where Lattica
SDK nodes tell each other their relayed addresses (``p2p-circuit-broadcast``).

An SDK node that gets a reservation on a relay publishes ``<relay address>/p2p-circuit/p2p/<its
PeerId>`` there with its swarm's protocol version (bincode of the two strings; earlier SDKs sent
the address alone, as UTF-8), and every node of that swarm that reads it adds the address to its
book for the author. We do the same both ways: our ``/p2p-circuit`` addresses are published when the NAT
manager advertises them (tried again every ``RETRY`` seconds until one reaches a peer, and
again every ``republish`` seconds while we hold them: the SDK publishes once, and a node that
joins later would not learn them), and an address read from the
topic is kept for its author when it is a relayed address that ends with the author's own
PeerId (the author signed it; nobody can file an address under someone else's name): in the
address book if we know the author (connected, or there already), else as a hint (dialed
while the author has no address of its own word, under a budget per destination), so that a
flood of fresh authors cannot push the peers we know out of the book.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lattica._multiaddr import Multiaddr
from lattica.errors import LatticaError
from lattica.logging import get_logger
from lattica.sdk import _wire as w

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica.actors.pubsub import PubSubService
    from lattica.config import SdkConfig
    from lattica.pubsub._subscription import Message

log = get_logger("lattica.sdk")

__all__ = ["SdkSwarm", "MAX_ADDR"]

MAX_ADDR = 512  # bytes of an address message we read
RETRY = 5.0  # s between tries of an address of ours that reached nobody


class SdkSwarm:
    """Our relayed addresses out on the SDK's topic, the SDK nodes' in (see the module docstring)."""

    def __init__(self, host: HostView, pubsub: PubSubService, cfg: SdkConfig, protocol_version: str) -> None:
        """``protocol_version``: our identify's, the swarm's name (messages of others are ignored)."""
        self.host = host
        self.protocol_version = protocol_version
        self.pubsub = pubsub
        self.cfg = cfg
        self._published: set[Multiaddr] = set()
        self._unsent: set[Multiaddr] = set()  # ours that reached nobody yet
        self._task: asyncio.Task | None = None
        self.learned = 0  # addresses taken from the topic
        host.events.addresses_changed.subscribe(self._on_addresses)

    async def astart(self) -> None:
        self.pubsub.subscribe(self.cfg.relay_topic, handler=self._on_message)
        self._task = self.host.spawn(self._republish())

    def _circuits(self) -> list[Multiaddr]:
        return [a for a in self.host.advertised_addrs() if a.is_circuit]

    def _on_addresses(self, addrs: list[Multiaddr]) -> None:
        fresh = [a for a in addrs if a.is_circuit and a not in self._published and a not in self._unsent]
        self._published &= set(addrs)
        self._unsent &= set(addrs)
        if fresh:
            self._unsent.update(fresh)
            self.host.spawn(self._publish(fresh))

    async def _publish(self, addrs: list[Multiaddr]) -> None:
        """Publish ``addrs`` (waiting briefly for the topic's peers, as a fresh node's publish
        does); one that reached nobody is tried again every ``RETRY`` seconds."""
        me = self.host.peer_id
        for addr in addrs:
            text = str(addr.without_peer_id()) + f"/p2p/{me}"
            try:
                reach = await self.pubsub.publish_soon(
                    self.cfg.relay_topic, w.encode_relay_addr(text, self.protocol_version)
                )
            except (LatticaError, ValueError, TypeError) as e:
                log.info("relayed address not published", addr=text, reason=str(e))
                continue
            if reach:
                self._unsent.discard(addr)
                self._published.add(addr)

    async def _republish(self) -> None:
        loop = self.host.loop
        due = loop.time() + self.cfg.republish
        while True:
            await asyncio.sleep(RETRY)
            if self._unsent:
                await self._publish(sorted(self._unsent, key=str))
            if loop.time() >= due:
                due = loop.time() + self.cfg.republish
                await self._publish(self._circuits())

    def _on_message(self, msg: Message) -> None:
        """An SDK node's relayed address: kept for its author if it is one, of the author's own."""
        data = msg.data
        if not isinstance(data, bytes) or len(data) > MAX_ADDR or msg.author == self.host.peer_id:
            return
        try:
            text, swarm = w.decode_relay_addr(data)
            addr = Multiaddr(text)
        except (LatticaError, ValueError):
            return
        if swarm is not None and swarm != self.protocol_version:
            return  # (another swarm's)
        if not addr.is_circuit or addr.peer_id != msg.author:
            return
        # an author we know (connected, or in the address book) is filed by its own word; any
        # other is a hint, kept apart: authors cost nothing, and a flood of them must not push
        # the peers we know out of the book (hostile review)
        known = msg.author in self.host.conns or msg.author in self.host.peer_addrs
        self.host.remember_addrs(msg.author, [addr], hint=not known)
        self.learned += 1

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
