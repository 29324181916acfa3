"""What the pub-sub service sends to peers: one queue per peer (``lattica.pubsub._outbound``,
bounded by ``peer_queue`` messages and ``peer_queue_bytes``, its batches within the wire's
bounds), drained by calls to the peer's ``pubsub`` actor, at most ``in_flight`` at once (``rpc``,
or a stranger's ``open_rpc``). Loaded with the router, at first use."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from lattica.actors.pubsub import wire
from lattica.errors import ActorNotFound, LatticaError, PermissionDenied
from lattica.logging import get_logger
from lattica.pubsub._outbound import Bounds, Outbound

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.calls import Calls
    from lattica._runtime.refs import ActorRef
    from lattica.config import PubSubConfig
    from lattica.pubsub._router import Router, Rpc

log = get_logger("lattica.pubsub")

__all__ = ["Sending", "BOUNDS", "BATCH_BYTES"]

BATCH_BYTES = 8 << 20  # messages' bytes in one call to a peer (far below a frame's limit)
BOUNDS = Bounds(wire.MAX_ENTRIES, wire.MAX_IHAVE_TOPICS, wire.MAX_BATCH_IDS, BATCH_BYTES)


class Sending:
    """The queues to the router's peers (see the module docstring). ``strangers``: the peers
    outside our mesh (the service's set), called on ``open_rpc``; ``ref(peer)``: the peer's
    ``pubsub`` actor."""

    def __init__(
        self,
        runtime: Calls,
        cfg: PubSubConfig,
        router: Router,
        strangers: set[PeerId],
        ref: Callable[[PeerId], ActorRef],
    ) -> None:
        self.rt = runtime
        self.host = runtime.host
        self.cfg = cfg
        self.router = router
        self._strangers = strangers
        self._ref = ref
        self.queues: dict[PeerId, Outbound] = {}
        self.drained = asyncio.Event()  # a batch went out: publishers waiting for room look again

    def send(self, peer: PeerId, rpc: Rpc) -> None:
        """Queue ``rpc`` for ``peer`` (shedding what is over its bounds), and send while calls
        on the way are fewer than ``in_flight``."""
        ob = self.queues.get(peer)
        if ob is None:
            ob = self.queues[peer] = Outbound(BOUNDS)
        ob.add(rpc, self.cfg.peer_queue, self.cfg.peer_queue_bytes)
        if ob.in_flight < self.cfg.in_flight:
            ob.in_flight += 1
            self.host.spawn(self._drain(peer, ob))

    def forget(self, peer: PeerId) -> None:
        """``peer`` is gone: what waited for it is dropped."""
        self.queues.pop(peer, None)

    def busy(self) -> bool:
        """Whether any batch is on its way."""
        return any(o.in_flight for o in self.queues.values())

    def backlogged(self) -> bool:
        """Whether the slowest peer that is taking any messages has half its queue waiting."""
        cfg = self.cfg
        return any(
            o.in_flight and (len(o.pending.messages) >= cfg.peer_queue // 2 or o.bytes >= cfg.peer_queue_bytes // 2)
            for o in self.queues.values()
        )

    def dropped(self) -> int:
        """Messages dropped from the queues (over their bounds, or not delivered)."""
        return sum(o.dropped for o in self.queues.values())

    async def _drain(self, peer: PeerId, ob: Outbound) -> None:
        try:
            while ob.pending and self.queues.get(peer) is ob:
                rpc = ob.take()
                try:
                    method = "open_rpc" if peer in self._strangers else "rpc"
                    await self.rt.call(self._ref(peer), method, (wire.encode(rpc),), {}, timeout=10.0)
                except (ActorNotFound, PermissionDenied) as e:
                    log.debug("peer does not take pub-sub from us", peer=str(peer), reason=str(e))
                    self.router.remove_peer(peer, self.host.loop.time())
                    self.queues.pop(peer, None)
                    return
                except LatticaError as e:
                    ob.dropped += len(rpc.messages)
                    log.debug("pub-sub batch not delivered", peer=str(peer), reason=str(e))
                finally:
                    self.drained.set()
        finally:
            ob.in_flight -= 1
