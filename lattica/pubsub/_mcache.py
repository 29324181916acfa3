"""The router's message cache (``lattica.pubsub._router``): the messages it accepted or published
in the last ``history_length`` heartbeats (at most ``mcache_bytes`` of them, the oldest dropped
beyond), to answer IWANTs; the ids of the last ``history_gossip`` are what its IHAVEs name."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import Envelope, GossipParams

__all__ = ["MessageCache"]


class MessageCache:
    """The router's part that keeps recent messages (see the module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams

    def __init__(self) -> None:
        super().__init__()
        self._mcache: dict[bytes, Envelope] = {}
        self._mcache_bytes = 0
        self._windows: list[deque[bytes]] = [deque()]  # ids by heartbeat, newest first

    def _cache(self, msg: Envelope) -> None:
        mid = msg.id
        if mid not in self._mcache:
            self._mcache[mid] = msg
            self._mcache_bytes += msg.size
            self._windows[0].append(mid)
            while self._mcache_bytes > self.p.mcache_bytes and len(self._mcache) > 1:
                oldest = next(w for w in reversed(self._windows) if w)
                gone = self._mcache.pop(oldest.popleft(), None)
                if gone is not None:
                    self._mcache_bytes -= gone.size

    def _recent(self) -> dict[str, list[bytes]]:
        """The ids of the cached messages of the last ``history_gossip`` heartbeats, by topic."""
        recent: dict[str, list[bytes]] = {}
        for window in self._windows[: self.p.history_gossip]:
            for mid in window:
                msg = self._mcache.get(mid)
                if msg is not None:
                    recent.setdefault(msg.topic, []).append(mid)
        return recent

    def _shift(self) -> None:
        """A heartbeat's window begins; the oldest beyond ``history_length`` leaves the cache."""
        self._windows.insert(0, deque())
        while len(self._windows) > self.p.history_length:
            for mid in self._windows.pop():
                gone = self._mcache.pop(mid, None)
                if gone is not None:
                    self._mcache_bytes -= gone.size
