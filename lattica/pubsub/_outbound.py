"""A peer's outbound queue, sans-IO: the router's batches for one peer wait merged into one,
bounded by the glue's ``peer_queue`` messages and ``peer_queue_bytes`` (IHAVE gossip dropped
first, then the oldest messages), and leave in batches within the wire's bounds (``Bounds``:
the glue, ``lattica.actors.pubsub``, gives them)."""

from __future__ import annotations

from dataclasses import dataclass

from lattica.pubsub._router import Rpc

__all__ = ["Bounds", "Outbound"]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one batch to a peer may hold."""

    entries: int  # subscriptions, messages, grafts, prunes, chokes, unchokes
    ihave_topics: int  # topics its IHAVE names
    ids: int  # ids of all its IHAVEs, IWANTs and IDONTWANTs together
    bytes: int  # its messages' bytes (one message larger than this still goes, alone)


class Outbound:
    """What waits to be sent to one peer: one merged batch (its messages' bytes counted), and
    the calls on the way (``in_flight``, the glue's count)."""

    __slots__ = ("pending", "bytes", "in_flight", "dropped", "bounds")

    def __init__(self, bounds: Bounds) -> None:
        self.pending = Rpc()
        self.bytes = 0
        self.in_flight = 0
        self.dropped = 0
        self.bounds = bounds

    def add(self, rpc: Rpc, cap: int, cap_bytes: int) -> None:
        """Merge ``rpc`` into the pending batch, then shed what is over ``cap`` messages (IHAVE
        ids counted 64 to a message) or ``cap_bytes``: IHAVE gossip first, then the oldest
        messages (counted in ``dropped``); control and ids are trimmed to the bounds."""
        p, b = self.pending, self.bounds
        p.subscribe = (p.subscribe + rpc.subscribe)[-b.entries :]
        p.graft = (p.graft + rpc.graft)[-b.entries :]
        p.prune = (p.prune + rpc.prune)[-b.entries :]
        p.choke = (p.choke + rpc.choke)[-b.entries :]
        p.unchoke = (p.unchoke + rpc.unchoke)[-b.entries :]
        p.messages += rpc.messages
        self.bytes += sum(m.size for m in rpc.messages)
        p.ihave += rpc.ihave
        p.iwant += rpc.iwant
        p.idontwant += rpc.idontwant
        over = len(p.messages) + sum(len(ids) for _, ids in p.ihave) // 64 - cap
        if (over > 0 or self.bytes > cap_bytes) and p.ihave:
            p.ihave = []  # gossip goes first
            over = len(p.messages) - cap
        if over > 0 or self.bytes > cap_bytes:  # then the oldest messages
            n = max(over, 0)
            gone = sum(m.size for m in p.messages[:n])
            while self.bytes - gone > cap_bytes and n < len(p.messages):
                gone += p.messages[n].size
                n += 1
            del p.messages[:n]
            self.bytes -= gone
            self.dropped += n
        if len(p.ihave) > b.ihave_topics:
            del p.ihave[: len(p.ihave) - b.ihave_topics]
        ids = sum(len(i) for _, i in p.ihave)
        if ids + len(p.iwant) + len(p.idontwant) > b.ids:
            room = b.ids // 2  # IWANT and IDONTWANT at most half each, then IHAVE ids, newest first, as far as they fit
            del p.iwant[: max(len(p.iwant) - room, 0)]
            del p.idontwant[: max(len(p.idontwant) - room, 0)]
            left = b.ids - len(p.iwant) - len(p.idontwant)
            kept: list = []
            for topic, i in reversed(p.ihave):
                if left <= 0:
                    break
                kept.append((topic, i[-left:]))
                left -= len(kept[-1][1])
            p.ihave = kept[::-1]

    def take(self) -> Rpc:
        """The next batch within the bounds: at most ``entries`` messages and ``bytes`` of them
        (or one); the rest stays pending."""
        p, b = self.pending, self.bounds
        n = size = 0
        for m in p.messages:
            if n == b.entries or (n and size + m.size > b.bytes):
                break
            n += 1
            size += m.size
        if n == len(p.messages):
            self.pending = Rpc()
            self.bytes = 0
            return p
        out = Rpc(
            subscribe=p.subscribe,
            messages=p.messages[:n],
            ihave=p.ihave,
            iwant=p.iwant,
            graft=p.graft,
            prune=p.prune,
            idontwant=p.idontwant,
            choke=p.choke,
            unchoke=p.unchoke,
        )
        self.pending = Rpc(messages=p.messages[n:])
        self.bytes -= size
        return out
