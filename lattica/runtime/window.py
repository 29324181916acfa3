"""The consuming side of a stream's item credit, sans-IO: how far ahead the producer may send, and
when to grant it more. Both directions of actor-call streaming use it: a streaming call's results
(the caller consumes them: ``refs._StreamState``) and a streamed argument (the callee consumes
it: ``local.ArgStream``).

The producer may send ``window`` items ahead; credit goes back for every ``BATCH`` (8) items
taken (half the first window), whatever the window has grown to: a producer may hold less credit
than we granted (an older one clamps at 16; a newer one at what 8 MiB holds of its items), and
after any grant it can send at least 8, so the stream never waits on a batch the producer cannot
send. A window that holds the producer back on a long path grows: when, over the last half
window of items, the consumer ran out of items and still took them within ``GROW_WITHIN`` (1.5)
round trips, the producer was sending at least a third of a window per round trip and then
waiting for credit (a credit-bound stream takes about one round trip per half window), so the
window doubles, up to MAX_STREAM_WINDOW items and only while that many items of the size seen so
far fit in STREAM_WINDOW_BYTES (the producer enforces its own byte bound). Items taken from a full
buffer prove nothing (the producer ran ahead), hence the first condition.

Bytes are bounded on this side too, not only by the producer's own clamp: credit granted for
small items can carry big ones (items that grow after the window grew, or a producer that does
not clamp), so while the items waiting to be taken hold STREAM_WINDOW_BYTES or more, grants are
held back and go out once they hold less (an emptied buffer always releases them: no stall). An
item beyond all the credit ever granted means a broken or hostile producer: ``received`` says so
and the glue ends the stream. There is no cut-off by bytes: a hostile review showed an honest
producer can exceed any fixed one (grants made while its items were small, some of them
growing the window, are still on their way when its items become large, and a grant does not
say how much of it is growth), so unread bytes are bounded only by the credit granted times the
largest message.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from lattica.runtime.limits import MAX_STREAM_WINDOW, STREAM_WINDOW, STREAM_WINDOW_BYTES

__all__ = ["ItemWindow", "SentItems", "credit_cap", "BATCH", "GROW_WITHIN"]

BATCH = STREAM_WINDOW // 2  # items taken per grant
GROW_WITHIN = 1.5  # round trips: half a window taken within this, by a consumer that ran dry, doubles it


class ItemWindow:
    """One stream's credit as its consumer keeps it (see the module docstring). ``rtt`` gives the
    path's round trip in seconds (None: unknown, and the window stays at its first size)."""

    __slots__ = ("window", "starved", "item_bytes", "buffered", "_sizes", "_held", "_allowed", "_consumed", "_epoch_at", "_epoch_taken", "_rtt")

    def __init__(self, rtt: Callable[[], float | None] | None = None) -> None:
        self.window = STREAM_WINDOW
        self.starved = False  # the consumer waited for an item since the current half window began
        self.item_bytes = 0.0  # items' encoded size (moving average; 0: not known, a local stream)
        self.buffered = 0  # encoded bytes of the items received and not yet taken
        self._sizes: collections.deque[int] = collections.deque()  # ... item by item, in order
        self._held = 0  # credit due but held back while the buffered items hold STREAM_WINDOW_BYTES
        self._allowed = STREAM_WINDOW  # items the producer may have sent: the first window, and every grant
        self._consumed = 0  # items taken since the last grant
        self._epoch_at = time.monotonic()  # when the current half window of items began
        self._epoch_taken = 0  # items taken since
        self._rtt = rtt

    def start(self, rtt: Callable[[], float | None] | None) -> None:
        """The stream is under way now (a call bound to its channel), timed with ``rtt``."""
        self._rtt = rtt
        self._epoch_at = time.monotonic()

    def received(self, nbytes: int = 0) -> str | None:
        """An item of ``nbytes`` encoded arrived: None, or why the producer must be cut off."""
        self._allowed -= 1
        if self._allowed < 0:
            return "the producer sent more items than it was granted"
        self._sizes.append(nbytes)
        self.buffered += nbytes
        if nbytes:
            self.item_bytes = nbytes if not self.item_bytes else 0.875 * self.item_bytes + 0.125 * nbytes
        return None

    def took(self) -> int:
        """The consumer took the oldest item: the credit to grant now (0: none yet)."""
        if self._sizes:
            self.buffered -= self._sizes.popleft()
        self._consumed += 1
        self._epoch_taken += 1
        if self._consumed >= BATCH:
            n, self._consumed = self._consumed, 0
            self._held += n + self._grow()
        return self._release() if self._held and self.buffered < STREAM_WINDOW_BYTES else 0

    def _release(self) -> int:
        n, self._held = self._held, 0
        self._allowed += n
        return n

    def _grow(self) -> int:
        """Credit to add to this grant: a whole window when the window doubles, else none."""
        fits = max(STREAM_WINDOW, int(STREAM_WINDOW_BYTES // self.item_bytes)) if self.item_bytes else MAX_STREAM_WINDOW
        if self.window > fits:  # items grew (the producer keeps its own credit within its bytes)
            self.window = fits
        if self._epoch_taken < self.window // 2:
            return 0
        now = time.monotonic()
        took, starved = now - self._epoch_at, self.starved
        self._epoch_at, self._epoch_taken, self.starved = now, 0, False
        if starved and self.window * 2 <= min(fits, MAX_STREAM_WINDOW) and self._rtt is not None:
            rtt = self._rtt()
            if rtt is not None and took < GROW_WITHIN * rtt:
                extra = self.window
                self.window *= 2
                return extra
        return 0


def credit_cap(item_bytes: float) -> int:
    """The most credit a stream's producer holds: a consumer may grow its window to
    MAX_STREAM_WINDOW items, but only STREAM_WINDOW_BYTES of items this size (never under
    STREAM_WINDOW; just that until an item has gone out and its size is known)."""
    if not item_bytes:
        return STREAM_WINDOW
    return max(STREAM_WINDOW, min(MAX_STREAM_WINDOW, int(STREAM_WINDOW_BYTES // item_bytes)))


class SentItems:
    """A stream producer's items sent and not yet credited back (their sizes, oldest first: a
    grant of ``n`` means the consumer took the oldest ``n``), and so the most credit it may
    hold: what ``credit_cap`` allows for items this size, and only as many as keep what is
    outstanding within STREAM_WINDOW_BYTES, or under 16 items whatever their size. Grants issued
    while the items were small then cannot fill the consumer with big ones, except for the part
    of a grant that grew the window: it counts as items taken, so the list empties sooner than
    the consumer's buffer does (a grant does not say how much of it is growth)."""

    __slots__ = ("_sizes", "bytes", "item_bytes")

    def __init__(self) -> None:
        self._sizes: collections.deque[int] = collections.deque()
        self.bytes = 0  # encoded bytes sent and not credited back
        self.item_bytes = 0.0  # the items' encoded size (moving average)

    def sent(self, nbytes: int) -> None:
        self._sizes.append(nbytes)
        self.bytes += nbytes
        self.item_bytes = nbytes if not self.item_bytes else 0.875 * self.item_bytes + 0.125 * nbytes

    def credited(self, n: int) -> None:
        sizes = self._sizes
        for _ in range(min(n, len(sizes))):
            self.bytes -= sizes.popleft()

    def cap(self) -> int:
        """The most credit the producer may hold now (at least 16 once nothing is outstanding)."""
        cap = credit_cap(self.item_bytes)
        if not self.item_bytes:
            return cap
        room = max(STREAM_WINDOW - len(self._sizes), int((STREAM_WINDOW_BYTES - self.bytes) // self.item_bytes))
        return max(0, min(cap, room))
