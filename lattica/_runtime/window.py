"""A stream's item credit, sans-IO, on both sides: how far ahead the producer may send, when the
consumer grants it more (``ItemWindow``) and what the producer may send now (``SentItems``). Both
directions of actor-call streaming use it: a streaming call's results (the caller consumes them:
``refs._StreamState``) and a streamed argument (the callee consumes it: ``local.ArgStream``).

The producer may send ``window`` items ahead; credit goes back for every ``BATCH`` (8) items
taken (half the first window), whatever the window has grown to: a producer may hold less credit
than we granted (it clamps at what 8 MiB holds of its items, an older one at 16), and after any
grant it can send at least 8, so the stream never waits on a batch the producer cannot send. A
window that holds the producer back on a long path grows: when, over the last half window of
items, the consumer ran out of items and still took them within ``GROW_WITHIN`` (1.5) round
trips, the producer was sending at least a third of a window per round trip and then waiting for
credit (a credit-bound stream takes about one round trip per half window), so the window
doubles, up to MAX_STREAM_WINDOW items and only while that many items of the size seen so far
fit in STREAM_WINDOW_BYTES. Items taken from a full buffer prove nothing (the producer ran ahead),
hence the first condition. Windows grow only where grants say how many items were taken
(``/lattica/rpc/2``); elsewhere they stay at 16 items.

Bytes are bounded exactly, whatever the items' sizes do: each grant says how many of its items
were taken (the rest is growth), so the producer knows its items sent and not yet taken, and
sends the next one only while they are fewer than 16 or hold less than STREAM_WINDOW_BYTES. The
consumer's unread items are always among those (it reports what it took only after taking it),
so an item arriving while 16 or more items holding STREAM_WINDOW_BYTES or more wait unread means
a broken or hostile producer, as does an item beyond all the credit ever granted: ``received``
says so and the glue ends the stream. What waits unread is therefore under 8 MiB plus one item,
or at most 16 items.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from lattica._runtime.limits import MAX_STREAM_WINDOW, STREAM_WINDOW, STREAM_WINDOW_BYTES

__all__ = ["ItemWindow", "SentItems", "credit_cap", "BATCH", "GROW_WITHIN"]

BATCH = STREAM_WINDOW // 2  # items taken per grant
GROW_WITHIN = 1.5  # round trips: half a window taken within this, by a consumer that ran dry, doubles it


class ItemWindow:
    """One stream's credit as its consumer keeps it (see the module docstring). ``rtt`` gives the
    path's round trip in seconds (None: unknown, and the window stays at its first size)."""

    __slots__ = (
        "window",
        "starved",
        "item_bytes",
        "buffered",
        "_sizes",
        "_allowed",
        "_consumed",
        "_epoch_at",
        "_epoch_taken",
        "_rtt",
    )

    def __init__(self, rtt: Callable[[], float | None] | None = None) -> None:
        self.window = STREAM_WINDOW
        self.starved = False  # the consumer waited for an item since the current half window began
        self.item_bytes = 0.0  # items' encoded size (moving average; 0: not known, a local stream)
        self.buffered = 0  # encoded bytes of the items received and not yet taken
        self._sizes: collections.deque[int] = collections.deque()  # ... item by item, in order
        self._allowed = STREAM_WINDOW  # items the producer may have sent: the first window, and every grant
        self._consumed = 0  # items taken since the last grant
        self._epoch_at = time.monotonic()  # when the current half window of items began
        self._epoch_taken = 0  # items taken since
        self._rtt = rtt

    def start(self, rtt: Callable[[], float | None] | None) -> None:
        """The stream is under way now (a call bound to its channel), timed with ``rtt`` (None,
        or returning None: the window does not grow)."""
        self._rtt = rtt
        self._epoch_at = time.monotonic()

    def received(self, nbytes: int = 0) -> str | None:
        """An item of ``nbytes`` encoded arrived: None, or why the producer must be cut off."""
        self._allowed -= 1
        if self._allowed < 0:
            return "the producer sent more items than it was granted"
        if len(self._sizes) >= STREAM_WINDOW and self.buffered >= STREAM_WINDOW_BYTES:
            return f"the producer sent an item while {len(self._sizes)} items of {self.buffered} bytes waited unread"
        self._sizes.append(nbytes)
        self.buffered += nbytes
        if nbytes:
            self.item_bytes = nbytes if not self.item_bytes else 0.875 * self.item_bytes + 0.125 * nbytes
        return None

    def took(self) -> tuple[int, int] | None:
        """The consumer took the oldest item: the grant to send now, (credit, items taken of it),
        or None."""
        if self._sizes:
            self.buffered -= self._sizes.popleft()
        self._consumed += 1
        self._epoch_taken += 1
        if self._consumed < BATCH:
            return None
        taken, self._consumed = self._consumed, 0
        self._grow()
        # credit the producer holds plus items unread stay within the window: growth adds only
        # what it lacks (after items grew and the window came down, credit granted before stays)
        n = taken + max(0, self.window - (self._allowed + taken + len(self._sizes)))
        self._allowed += n
        return n, taken

    def _grow(self) -> None:
        """Double the window if the last half window says so (module docstring)."""
        fits = max(STREAM_WINDOW, int(STREAM_WINDOW_BYTES // self.item_bytes)) if self.item_bytes else MAX_STREAM_WINDOW
        if self.window > fits:  # items grew (the producer holds back by bytes itself)
            self.window = fits
        if self._epoch_taken < self.window // 2:
            return
        now = time.monotonic()
        took, starved = now - self._epoch_at, self.starved
        self._epoch_at, self._epoch_taken, self.starved = now, 0, False
        if starved and self.window * 2 <= min(fits, MAX_STREAM_WINDOW) and self._rtt is not None:
            rtt = self._rtt()
            if rtt is not None and took < GROW_WITHIN * rtt:
                self.window *= 2


def credit_cap(item_bytes: float) -> int:
    """The most credit a stream's producer holds: a consumer may grow its window to
    MAX_STREAM_WINDOW items, but only STREAM_WINDOW_BYTES of items this size (never under
    STREAM_WINDOW; just that until an item has gone out and its size is known)."""
    if not item_bytes:
        return STREAM_WINDOW
    return max(STREAM_WINDOW, min(MAX_STREAM_WINDOW, int(STREAM_WINDOW_BYTES // item_bytes)))


class SentItems:
    """A stream producer's items sent and not yet taken (their sizes, oldest first: a grant that
    took ``n`` items took the oldest ``n``): whether it may send the next one now (``may_send``)
    and the most credit it holds (``cap``: what ``credit_cap`` allows for items this size, and
    only as many as keep what is outstanding within STREAM_WINDOW_BYTES, or under 16 items
    whatever their size; beyond it credit is dropped, so neither a consumer granting without
    reading nor items that grow make the producer queue more). Toward a consumer whose grants do
    not say what was taken (``/lattica/rpc/1``), a grant counts as all taken (exact where its
    window does not grow, as it does not there)."""

    __slots__ = ("_sizes", "bytes", "item_bytes")

    def __init__(self) -> None:
        self._sizes: collections.deque[int] = collections.deque()
        self.bytes = 0  # encoded bytes sent and not taken
        self.item_bytes = 0.0  # the items' encoded size (moving average)

    def sent(self, nbytes: int) -> None:
        self._sizes.append(nbytes)
        self.bytes += nbytes
        self.item_bytes = nbytes if not self.item_bytes else 0.875 * self.item_bytes + 0.125 * nbytes

    def taken(self, n: int) -> None:
        sizes = self._sizes
        for _ in range(min(n, len(sizes))):
            self.bytes -= sizes.popleft()

    def may_send(self) -> bool:
        """Whether the next item may go now: what the consumer checks (``ItemWindow.received``),
        and never more than MAX_STREAM_WINDOW items not taken (a consumer that grants without
        saying it took anything cannot make this list long)."""
        n = len(self._sizes)
        return n < STREAM_WINDOW or (self.bytes < STREAM_WINDOW_BYTES and n < MAX_STREAM_WINDOW)

    def cap(self) -> int:
        """The most credit the producer may hold now (at least 16 once nothing is outstanding)."""
        cap = credit_cap(self.item_bytes)
        if not self.item_bytes:
            return cap
        n = len(self._sizes)
        room = max(
            STREAM_WINDOW - n, min(MAX_STREAM_WINDOW - n, int((STREAM_WINDOW_BYTES - self.bytes) // self.item_bytes))
        )
        return max(0, min(cap, room))
