"""The router's gossip (``lattica.pubsub._router``): IHAVE, IWANT and IDONTWANT.

On the heartbeat, IHAVE with the ids of the last ``history_gossip`` windows of messages goes to
D_lazy (or ``gossip_factor`` of the) other peers of each topic; they answer IWANT for what they
miss. An IWANT we send is a promise: the message not delivered within ``iwant_followup`` costs
the peer (P7), and the next peer that announced it is asked. IHAVEs per peer per heartbeat and
ids asked are capped; one peer gets one message through IWANT at most ``gossip_retransmission``
times. IDONTWANT (GossipSub v1.2) tells the mesh a message arrived before we validated it.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import Envelope, GossipParams, Rpc
    from lattica.pubsub._score import PeerScore
    from lattica.pubsub._seen import Seen

__all__ = ["Gossip"]


class Gossip:
    """The router's part that gossips (see the module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams
        rng: random.Random
        scores: PeerScore
        peers: dict[Hashable, set[str]]
        topics: dict[str, set[Hashable]]
        mesh: dict[str, set[Hashable]]
        fanout: dict[str, set[Hashable]]
        _seen: OrderedDict[bytes, Seen]
        _mcache: dict[bytes, Envelope]

        def _out(self, peer: Hashable) -> Rpc: ...
        def _score(self, peer: Hashable, now: float) -> float: ...
        def _forgotten(self, mid: bytes) -> bool: ...
        def _recent(self) -> dict[str, list[bytes]]: ...

    def __init__(self) -> None:
        super().__init__()
        self._iwant_served: dict[tuple[Hashable, bytes], int] = {}
        self._ihaves_heard: dict[Hashable, int] = {}
        self._asked: dict[Hashable, int] = {}
        self._promises: dict[bytes, tuple[Hashable, float]] = {}
        self._offered: dict[bytes, list[Hashable]] = {}  # ids asked of one peer -> other peers that have them
        self._dont: OrderedDict[bytes, set[Hashable]] = OrderedDict()  # ids peers told us not to send, not seen yet
        self._dont_heard: dict[Hashable, int] = {}

    def _on_ihave(self, peer: Hashable, ihave: list, now: float) -> None:
        heard = self._ihaves_heard.get(peer, 0) + 1
        self._ihaves_heard[peer] = heard
        if heard > self.p.max_ihave_messages:
            return
        room = min(self.p.max_ihave_length, self.p.max_iwant_ids) - self._asked.get(peer, 0)
        if room <= 0:
            return
        want: list[bytes] = []
        for item in ihave[: self.p.max_ihave_messages]:
            if type(item) not in (tuple, list) or len(item) != 2:
                continue
            topic, ids = item
            if topic not in self.mesh or type(ids) is not list:
                continue
            for mid in ids[: self.p.max_ihave_length]:
                if type(mid) is bytes and mid not in self._seen and not self._forgotten(mid):
                    if mid not in self._promises:
                        want.append(mid)
                    else:
                        self._offer(mid, peer)
        if not want:
            return
        if len(want) > room:
            want = self.rng.sample(want, room)
        self._asked[peer] = self._asked.get(peer, 0) + len(want)
        self._out(peer).iwant.extend(want)
        for mid in want:
            self._promises[mid] = (peer, now + self.p.iwant_followup)

    def _on_iwant(self, peer: Hashable, ids: list, now: float) -> None:
        out = None
        for mid in ids[: self.p.max_iwant_ids]:
            msg = self._mcache.get(mid) if type(mid) is bytes else None
            if msg is None:
                continue
            key = (peer, mid)
            n = self._iwant_served.get(key, 0)
            if n >= self.p.gossip_retransmission:
                continue
            self._iwant_served[key] = n + 1
            if out is None:
                out = self._out(peer)
            out.messages.append(msg)
            entry = self._seen.get(mid)
            if entry is not None:
                entry.sent(peer)

    def _on_idontwant(self, peer: Hashable, ids: list) -> None:
        heard = self._dont_heard.get(peer, 0)
        room = self.p.max_idontwant - heard
        if room <= 0:
            return
        ids = ids[:room]
        self._dont_heard[peer] = heard + len(ids)
        for mid in ids:
            if type(mid) is not bytes or len(mid) > 128:
                continue
            entry = self._seen.get(mid)
            if entry is not None:
                entry.was_told(peer)
                continue
            peers = self._dont.get(mid)
            if peers is None:
                peers = self._dont[mid] = set()
                if len(self._dont) > self.p.seen_max:
                    self._dont.popitem(last=False)
            peers.add(peer)

    def _gossip(self, now: float) -> None:
        """IHAVE of the recent messages to peers of each topic outside its mesh (or fanout)."""
        p = self.p
        limit = self.scores.params.gossip_threshold
        for topic, ids in self._recent().items():
            inner = self.mesh.get(topic) or self.fanout.get(topic)
            if inner is None:
                continue
            others = [q for q in self.topics.get(topic, ()) if q not in inner and self._score(q, now) >= limit]
            if not others:
                continue
            n = max(p.d_lazy, int(len(others) * p.gossip_factor))
            chosen = others if n >= len(others) else self.rng.sample(others, n)
            if len(ids) > p.max_ihave_length:
                ids = self.rng.sample(ids, p.max_ihave_length)
            for peer in chosen:
                self._out(peer).ihave.append((topic, list(ids)))

    def _check_promises(self, now: float) -> None:
        """IWANTs not answered in time: the peer is scored down (once per heartbeat), the next
        peer that announced the message is asked."""
        broke = set()
        for mid, (peer, due) in list(self._promises.items()):
            if now >= due:
                del self._promises[mid]
                broke.add(peer)
                self._ask_another(mid, now)
        for peer in broke:  # asked with IWANT, never sent (once per peer and heartbeat)
            if peer in self.peers:
                self.scores.misbehaved(peer)

    def _next_round(self) -> None:
        """The per-heartbeat counts start again."""
        self._ihaves_heard.clear()
        self._asked.clear()
        self._dont_heard.clear()
        self._dont.clear()  # (they were for messages in flight a heartbeat ago)

    def _forget_served(self) -> None:
        """IWANTs answered of messages the cache no longer holds are forgotten."""
        if self._iwant_served and not self._mcache:
            self._iwant_served.clear()
        elif len(self._iwant_served) > 4 * len(self._mcache) + 1024:
            self._iwant_served = {k: v for k, v in self._iwant_served.items() if k[1] in self._mcache}

    def _offer(self, mid: bytes, peer: Hashable) -> None:
        """``peer`` has ``mid``, which we asked someone else for: the next to ask if that fails."""
        if peer == self._promises[mid][0]:
            return
        others = self._offered.get(mid)
        if others is None:
            if len(self._offered) >= self.p.max_iwant_ids * 4:
                return
            others = self._offered[mid] = []
        if len(others) < 4 and peer not in others:
            others.append(peer)

    def _ask_another(self, mid: bytes, now: float) -> None:
        """A promise to send ``mid`` was broken: ask the next peer that announced it."""
        others = self._offered.pop(mid, None)
        if not others or mid in self._seen:
            return
        for i, peer in enumerate(others):
            if peer in self.peers and self._asked.get(peer, 0) < self.p.max_iwant_ids:
                self._asked[peer] = self._asked.get(peer, 0) + 1
                self._out(peer).iwant.append(mid)
                self._promises[mid] = (peer, now + self.p.iwant_followup)
                if others[i + 1 :]:
                    self._offered[mid] = others[i + 1 :]
                return
