"""Budgets for partially received rpc messages: what a peer can make this node hold.

A message is held, piece by piece, until its last byte arrives (up to ``MAX_MESSAGE``). Without a
bound, a peer opening many call channels and never finishing a message would grow the node by
that much per channel. Each channel reader reports what it holds; a reader that would take its
peer over ``per_peer`` bytes (a stranger over ``per_stranger``, or strangers together over
``strangers``), or the node over ``per_node``, or whose message is not complete
``deadline`` seconds plus its declared length at ``min_rate`` after its first byte, fails with
MessageBudgetExceeded and its channel is reset. Complete messages, however large, cost nothing
here.

Reset rather than throttled at the node-wide budget, on purpose: a channel that waited for room
would keep holding its bytes, so channels waiting on each other could all stall until their
deadlines, and a member's unfinished messages would hold every honest call back meanwhile; a
reset frees the room at once and the caller's retry goes through.

Streams of libp2p protocols that carry length-prefixed messages (GossipSub's, Bitswap's) read
each through ``PartialMessages.read_delimited``: the same account, deadline and rate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica import _rpc as rpc
from lattica._framing import read_length
from lattica._identity import PeerId
from lattica.config import InboundBudget
from lattica.errors import FrameTooLarge, MessageBudgetExceeded

if TYPE_CHECKING:
    from lattica.transports.base import Stream

__all__ = ["InboundBudget", "PartialMessages", "BudgetedSplitter"]


class PartialMessages:
    """The node's account of bytes held in incomplete messages, per peer and in all."""

    __slots__ = ("budget", "total", "by_peer", "strangers")

    def __init__(self, budget: InboundBudget | None = None) -> None:
        self.budget = budget or InboundBudget()
        self.total = 0
        self.strangers = 0  # of which strangers hold
        self.by_peer: dict[PeerId, int] = {}

    def change(self, peer: PeerId, old: int, new: int, stranger: bool = False) -> None:
        """A reader of ``peer``'s now holds ``new`` bytes instead of ``old``; raises
        MessageBudgetExceeded (having changed nothing) when growing would exceed a budget.
        A ``stranger``'s bytes count against the strangers' smaller share too."""
        delta = new - old
        if not delta:
            return
        mine = self.by_peer.get(peer, 0) + delta
        if delta > 0:
            b = self.budget
            limit = b.per_stranger if stranger else b.per_peer
            if mine > limit:
                raise MessageBudgetExceeded(f"{peer.short()}'s partially received messages would exceed {limit} bytes")
            if stranger and self.strangers + delta > b.strangers:
                raise MessageBudgetExceeded(f"strangers' partially received messages would exceed {b.strangers} bytes")
            if self.total + delta > b.per_node:
                raise MessageBudgetExceeded(f"partially received messages would exceed this node's {b.per_node} bytes")
        if stranger:
            self.strangers += delta
        self.total += delta
        if mine:
            self.by_peer[peer] = mine
        else:
            self.by_peer.pop(peer, None)

    async def read_delimited(
        self,
        stream: Stream,
        peer: PeerId,
        limit: int,
        what: str,
        stranger: Callable[[PeerId], bool],
        idle: float | None = None,
    ) -> bytes:
        """One uvarint-length-prefixed message of ``peer``'s on ``stream`` (libp2p's framing):
        its length, within ``idle`` s (None: the stream may idle as long as it lives), at most
        ``limit`` bytes (FrameTooLarge naming ``what``, its body unread), then its bytes, held
        on this account while they arrive (``stranger(peer)``, asked once the length is in: a
        stranger's share and all strangers' too; MessageBudgetExceeded past a budget) and due
        within the budget's deadline plus the length at its least rate (TimeoutError)."""
        async with asyncio.timeout(idle):
            n = await read_length(stream)
        if n > limit:
            raise FrameTooLarge(f"a {what} of {n} bytes (at most {limit})")
        if not n:
            return b""
        is_stranger = stranger(peer)
        self.change(peer, 0, n, is_stranger)
        try:
            b = self.budget
            async with asyncio.timeout(b.deadline + n / b.min_rate):
                return await stream.readexactly(n)
        finally:
            self.change(peer, n, 0, is_stranger)


class BudgetedSplitter:
    """A FrameSplitter for one call channel whose incomplete frame counts against the node's
    budget; ``overdue()`` is called (on the loop) when a frame misses its deadline."""

    __slots__ = ("_split", "_account", "_peer", "_held", "_started", "_timer", "_loop", "_overdue", "stranger")

    def __init__(
        self,
        max_frame: int,
        account: PartialMessages,
        peer: PeerId,
        loop: asyncio.AbstractEventLoop,
        overdue: Callable[[str], Any],
    ) -> None:
        self._split = rpc.FrameSplitter(max_frame)
        self._account = account
        self._peer = peer
        self._held = 0
        self._started = 0.0  # loop time the incomplete frame's first byte arrived
        self._timer: asyncio.TimerHandle | None = None  # one per channel, re-armed only when it fires
        self._loop = loop
        self._overdue = overdue
        self.stranger = False  # set once the peer's circle is known (before its first byte is read)

    def feed(self, data: bytes) -> list:
        """Frames completed by ``data``; MessageBudgetExceeded when what stays held is over budget."""
        frames = self._split.feed(data)
        held = self._split.held
        if held != self._held:
            self._account.change(self._peer, self._held, held, self.stranger)
            if held and (frames or not self._held):  # a new frame started in this read
                self._started = self._loop.time()
                if self._timer is None:
                    self._timer = self._loop.call_at(self._started + self._allowed(), self._check)
            self._held = held
        elif held and frames:
            self._started = self._loop.time()
        return frames

    def _allowed(self) -> float:
        """Seconds the frame being received may take (its length may not be known yet: then the
        timer fires at the base deadline and looks again)."""
        b = self._account.budget
        return b.deadline + self._split.declared / b.min_rate

    def _check(self) -> None:
        self._timer = None
        if not self._held:
            return
        allowed = self._allowed()
        due = self._started + allowed
        if self._loop.time() >= due:
            self._overdue(f"a message from {self._peer.short()} did not complete within {allowed:.3g} s")
        else:  # the frame it was armed for completed; the one in progress started later
            self._timer = self._loop.call_at(due, self._check)

    def close(self) -> None:
        """The channel is done: give back what it held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            self._account.change(self._peer, self._held, 0, self.stranger)
            self._held = 0
