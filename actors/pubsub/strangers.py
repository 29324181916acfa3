"""Strangers' batches to the pub-sub service (``open_rpc``: the topics a node opens, see
``lattica.pubsub._open_topics``): what they may cost us, and their messages' turns.

A stranger's batches are taken at ``STRANGER_BATCHES`` (a second, and at once), all strangers'
together at ``STRANGERS_BATCHES`` (a libp2p peer's RPCs, about one per message, are charged by
their new messages instead; one without any by the batch budgets); their messages within the
strangers' share
(``PubSubConfig.strangers_messages``, the rest dropped before they are decoded, checked or
remembered), then checked ``SLICE`` at a turn of the loop, members' work served in between.

A libp2p stranger's RPC is charged before it is decoded (``actors/pubsub/meshsub.py``): every
protobuf field read, and every message id translated, against ``STRANGERS_FIELDS``, which all
strangers share (a field costs about a microsecond to decode, up to a millisecond a kilobyte
of dense fields); one that carries no message also takes a batch. Beyond, it is dropped
undecoded (counted, and told at most every ``LOG_EVERY`` s).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._budget import Buckets, StrangersShare
from lattica.logging import get_logger

if TYPE_CHECKING:
    import asyncio

    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica.config import PubSubConfig
    from lattica.pubsub._router import Envelope

log = get_logger("lattica.pubsub")

__all__ = ["Strangers", "SLICE", "WAITING", "STRANGERS_FIELDS"]

STRANGER_BATCHES = (50.0, 100.0)  # batches a second (and at once) we take from one stranger
STRANGERS_BATCHES = (20.0, 40.0)  # ... and from all strangers together (a batch holds up to hundreds of messages)
_STRANGERS_MAX = 4096  # strangers whose batches we count
# strangers' messages are checked this many at a turn of the loop, members' work in between: a
# stranger's batch costs members a wait of a few signature checks, not of hundreds
SLICE = 4
WAITING = 1024  # strangers' messages waiting for their turn (the oldest dropped beyond)
# protobuf fields all libp2p strangers' RPCs together may make us read a second (and at once),
# ids translated included: 1.6 to 3.4 us a field at worst (a message padded with junk fields, a
# thousand GRAFTs), so at most ~7 % of the loop; a go stranger's RPC of one message is 9 to 20
# fields, and the burst holds the largest RPC anyone may send (gs.MAX_FIELDS)
STRANGERS_FIELDS = (20_000.0, 64_000.0)
LOG_EVERY = 10.0  # s between two lines saying how many strangers' RPCs were dropped undecoded


class Strangers:
    """The router's peers outside our mesh (``peers``), and their batches' budgets and turns:
    ``take(peer, env, now)`` hands one waiting message to the router at its turn, ``done()``
    follows each slice."""

    def __init__(
        self,
        host: HostView,
        cfg: PubSubConfig,
        take: Callable[[PeerId, Envelope, float], None],
        done: Callable[[], None],
    ) -> None:
        self.host = host
        self.peers: set[PeerId] = set()  # router peers outside our mesh: open topics only
        self._take, self._done = take, done
        self._batches = Buckets(*STRANGER_BATCHES, _STRANGERS_MAX)
        self._all_batches = StrangersShare(*STRANGERS_BATCHES, lambda peer: True)  # (asked for strangers' batches only)
        rate = max(cfg.strangers_messages, 0.0)
        self._messages = StrangersShare(
            rate, max(2 * rate, 1.0), lambda peer: True
        )  # (PubSubConfig.strangers_messages)
        self._fields = Buckets(*STRANGERS_FIELDS, 1)  # (all strangers': one key)
        self.undecoded = 0  # libp2p strangers' RPCs dropped before they were decoded
        self._untold = 0  # of which not logged yet
        self._told_at = -LOG_EVERY
        self.waiting: deque[tuple[PeerId, Envelope]] = deque(maxlen=WAITING)
        self._turn: asyncio.Handle | None = None
        self._closed = False

    def admit(self, peer: PeerId) -> bool:
        """Whether a batch of ``peer`` is within its share and all strangers' (else it is dropped unread)."""
        return self._batches.take(peer) and self._all_batches.take(peer)

    def part(self, peer: PeerId, raw: Any) -> Any:
        """A stranger's batch with only as many of its messages as the strangers' share has
        left (the rest dropped before they are decoded, checked or remembered): what all
        strangers' messages together cost us is bounded, however many identities send them."""
        if type(raw) is not list or len(raw) < 2 or type(raw[1]) is not list or not raw[1]:
            return raw  # (nothing to cut; a malformed batch is wire.decode's to refuse)
        k = self.share(peer, len(raw[1]))
        return raw if k == len(raw[1]) else [raw[0], raw[1][:k], *raw[2:]]

    def fields_left(self) -> int:
        """Protobuf fields strangers' RPCs may make us read now (``STRANGERS_FIELDS``)."""
        return int(self._fields.available())

    def fields_read(self, n: int) -> None:
        """Strangers' RPCs made us read ``n`` fields (charged whatever became of them)."""
        if n > 0:
            self._fields.take(None, n, force=True)

    def dropped_undecoded(self, peer: PeerId, why: str) -> None:
        """A libp2p stranger's RPC was dropped before it was decoded: counted, and logged at
        most every ``LOG_EVERY`` s (a flood writes one line, not one a RPC)."""
        self.undecoded += 1
        self._untold += 1
        now = self.host.loop.time()
        if now - self._told_at >= LOG_EVERY:
            log.info("strangers' GossipSub RPCs dropped undecoded", count=self._untold, last=str(peer), reason=why)
            self._untold = 0
            self._told_at = now

    def share(self, peer: PeerId, n: int) -> int:
        """How many of ``n`` new messages of ``peer`` the strangers' share takes now (charged)."""
        return self._messages.take_up_to(peer, n)

    def wait(self, peer: PeerId, messages: list[Envelope]) -> None:
        """A stranger's messages (of open topics) wait for their turn."""
        self.peers.add(peer)
        self.waiting.extend((peer, m) for m in messages)
        self._next()

    def _next(self) -> None:
        """Take the next slice of strangers' messages at the loop's next turn (if any wait)."""
        if self._turn is None and self.waiting and not self._closed:
            self._turn = self.host.loop.call_soon(self._slice)

    def _slice(self) -> None:
        """Strangers' messages, a few (``SLICE``): what came from members meanwhile is served
        between the slices."""
        self._turn = None
        now, waiting = self.host.loop.time(), self.waiting
        try:
            for _ in range(min(SLICE, len(waiting))):
                peer, env = waiting.popleft()
                if peer in self.host.conns:  # (still connected)
                    self._take(peer, env, now)
            self._done()
        finally:
            self._next()  # (the rest waits its turn whatever became of this slice)

    def close(self) -> None:
        self._closed = True
        if self._turn is not None:
            self._turn.cancel()
        self.waiting.clear()
