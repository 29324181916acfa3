"""Token buckets by key: how often a peer (an IP, the whole node) may make us do something.

One bucket per key holds up to ``burst`` tokens and refills at ``rate`` tokens a second; a request
costs one token and is refused when the bucket is empty. The table is bounded: past ``max_keys``
the least recently active key is forgotten (it comes back with a full bucket, which is the most a
forgotten key can gain).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Buckets", "StrangersShare", "Turns"]


class Buckets:
    """Keyed token buckets (``rate`` per second, up to ``burst``), at most ``max_keys`` tracked."""

    __slots__ = ("rate", "burst", "max_keys", "_clock", "_state")

    def __init__(
        self, rate: float, burst: float, max_keys: int = 4096, clock: Callable[[], float] | None = None
    ) -> None:
        if rate < 0 or burst < 1 or max_keys < 1:
            raise ValueError("a budget needs rate >= 0, burst >= 1 and max_keys >= 1")
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._state: dict[Hashable, list[float]] = {}  # key -> [tokens, last refill], least recent first

    def take(self, key: Hashable = None, cost: float = 1.0, force: bool = False) -> bool:
        """Charge ``cost`` tokens to ``key``'s bucket; False (nothing charged) if it has fewer,
        unless ``force`` (charged anyway, into debt that later refills pay off)."""
        b = self._refilled(key)
        if b[0] < cost and not force:
            return False
        b[0] -= cost
        return b[0] >= 0

    def available(self, key: Hashable = None) -> float:
        """Tokens in ``key``'s bucket now (nothing is charged)."""
        return max(self._refilled(key)[0], 0.0)

    def wait(self, key: Hashable = None, cost: float = 1.0) -> float:
        """Seconds until ``key``'s bucket holds ``cost`` tokens (0: now); nothing is charged."""
        b = self._refilled(key)
        if b[0] >= cost:
            return 0.0
        return (cost - b[0]) / self.rate if self.rate else float("inf")

    def _refilled(self, key: Hashable) -> list[float]:
        now = time.monotonic() if self._clock is None else self._clock()
        b = self._state.pop(key, None)
        if b is None:
            b = [self.burst, now]
            while len(self._state) >= self.max_keys:
                del self._state[next(iter(self._state))]
        self._state[key] = b  # (re)inserted last: most recently active
        b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
        b[1] = now
        return b

    def __len__(self) -> int:
        return len(self._state)


class StrangersShare:
    """One budget all strangers share (``rate`` a second, up to ``burst``): what peers outside
    our mesh may cost together, however many identities they make; members are never charged
    (they are served first: what strangers cannot take is theirs)."""

    __slots__ = ("_stranger", "_bucket")

    def __init__(
        self, rate: float, burst: float, stranger: Callable[[Any], bool], clock: Callable[[], float] | None = None
    ) -> None:
        self._stranger = stranger
        self._bucket = Buckets(rate, burst, max_keys=1, clock=clock)

    @property
    def rate(self) -> float:
        return self._bucket.rate

    def take(self, peer: Hashable, cost: float = 1.0) -> bool:
        """Whether ``peer``'s request of ``cost`` may go ahead (charged to the share if it is a
        stranger's; False, nothing charged, when the share is spent)."""
        return not self._stranger(peer) or self._bucket.take(None, min(cost, self._bucket.burst))

    def charges(self, peer: Hashable) -> bool:
        """Whether ``peer``'s requests are charged to the share (a stranger's)."""
        return self._stranger(peer)

    def take_up_to(self, peer: Hashable, n: int) -> int:
        """How many of ``n`` requests of ``peer`` may go ahead, charged to the share (a member:
        all of them; a stranger: what the share holds now, perhaps none)."""
        if not self._stranger(peer):
            return n
        k = min(n, int(self._bucket.available()))
        if k > 0:
            self._bucket.take(None, k)
        return max(k, 0)

    def available(self, peer: Hashable) -> float:
        """What ``peer`` may take of the share now (a member: without end)."""
        return self._bucket.available() if self._stranger(peer) else float("inf")

    def wait(self, cost: float = 1.0) -> float:
        """Seconds until the share holds ``cost`` (0: now)."""
        return self._bucket.wait(None, min(cost, self._bucket.burst))


class Turns:
    """Strangers' requests waiting for a ``StrangersShare``, let through in arrival order as it
    refills, under one timer for all of them (with a timer each, every waiter woke to find one
    token for one of them: the loop spent on wake-ups what the share was there to bound)."""

    def __init__(self, share: StrangersShare, loop: asyncio.AbstractEventLoop) -> None:
        self.share = share
        self._loop = loop
        self._queue: collections.deque[tuple[asyncio.Future[None], Hashable, float]] = collections.deque()
        self._gone = 0  # waiters that gave up since the queue was last swept of them (about)
        self._timer: asyncio.TimerHandle | None = None

    async def take(
        self, peer: Hashable, cost: float = 1.0, give_up: Callable[[], bool] | None = None, every: float = 1.0
    ) -> bool:
        """Wait until ``peer`` may go ahead, charged ``cost`` of the share (a member: at once);
        False, nothing charged, if ``give_up()`` (asked every ``every`` s while waiting) says so."""
        if not self.share.charges(peer):
            return True
        self._skip_gone()
        if not self._queue and self.share.take(peer, cost):
            return True
        fut: asyncio.Future[None] = self._loop.create_future()
        self._queue.append((fut, peer, cost))
        self._arm()
        try:
            if give_up is None:
                await fut
                return True
            while True:  # (one wake-up a waiter every ``every`` s: not one per token)
                done, _ = await asyncio.wait((fut,), timeout=every)
                if done:
                    return True
                if give_up():
                    return False
        finally:
            fut.cancel()  # (served already: nothing; else its place is skipped)
            if fut.cancelled():  # (it gave up, or its task was cancelled)
                self._gone += 1
                if self._gone > 64 and 2 * self._gone > len(self._queue):
                    self._queue = collections.deque(w for w in self._queue if not w[0].done())
                    self._gone = 0

    def __len__(self) -> int:
        """Waiters still waiting."""
        return sum(1 for w in self._queue if not w[0].done())

    def _skip_gone(self) -> None:
        queue = self._queue
        while queue and queue[0][0].done():
            queue.popleft()

    def _arm(self) -> None:
        if self._timer is None and self._queue:
            # (at least 1 ms: uvloop runs a shorter timer at once, and _serve would find the
            # token not yet due and arm again, spinning until it is)
            self._timer = self._loop.call_later(
                min(max(self.share.wait(self._queue[0][2]), 0.001), 3600.0), self._serve
            )

    def _serve(self) -> None:
        self._timer = None
        while True:
            self._skip_gone()
            queue = self._queue
            if not queue:
                break
            fut, peer, cost = queue[0]
            if not self.share.take(peer, cost):
                break
            queue.popleft()
            fut.set_result(None)
        self._arm()
