"""The router's choking (``lattica.pubsub._router``): a mesh peer whose copies keep coming after
others' is asked to send only IHAVE (announced at once, fetched with IWANT when we lack the
message), so about ``d_eager`` full copies of each message arrive while the mesh stays D wide.
Once a heartbeat the slowest eager peer may be choked (past ``choke_after`` messages), and a
choked peer whose announcements came first unchoked (or any, below ``d_eager_min`` eager)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

from lattica.pubsub._seen import ACCEPTED

if TYPE_CHECKING:
    from lattica.pubsub._router import GossipParams, Rpc
    from lattica.pubsub._score import PeerScore
    from lattica.pubsub._seen import Seen

__all__ = ["Choking"]


class Choking:
    """The router's part that chokes and unchokes mesh peers (see the module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams
        scores: PeerScore
        _seen: OrderedDict[bytes, Seen]
        _rtt: dict[Hashable, float]
        plain: set[Hashable]
        _promises: dict[bytes, tuple[Hashable, float]]
        _asked: dict[Hashable, int]

        def _out(self, peer: Hashable) -> Rpc: ...
        def _forgotten(self, mid: bytes) -> bool: ...
        def _offer(self, mid: bytes, peer: Hashable) -> None: ...

    def __init__(self) -> None:
        super().__init__()
        self._choked_by: set[tuple[Hashable, str]] = set()  # (peer, topic): it asked us for IHAVE only
        self._choking: set[tuple[Hashable, str]] = set()  # (peer, topic): we asked it for IHAVE only
        # (mesh peer, topic) -> [firsts, later copies, their summed lateness]
        self._race: dict[tuple[Hashable, str], list] = {}
        self._announce: dict[Hashable, dict[str, list[bytes]]] = {}  # eager IHAVEs to choked peers, this flush

    def _on_announce(self, peer: Hashable, ihave: list, now: float) -> list:
        """IHAVEs from a mesh peer we choked are its eager announcements: fetch what we miss at
        once (it was faster than our eager peers: a point for unchoking it) and credit it as
        forwarding; what is left is ordinary gossip."""
        rest = []
        for item in ihave:
            if (
                type(item) not in (tuple, list)
                or len(item) != 2
                or (peer, item[0]) not in self._choking
                or type(item[1]) is not list
            ):
                rest.append(item)
                continue
            topic, ids = item
            race = self._race.get((peer, topic))
            want = []
            for mid in ids[: self.p.max_ihave_length]:
                if type(mid) is not bytes:
                    continue
                entry = self._seen.get(mid)
                if entry is None:
                    if self._forgotten(mid):
                        continue
                    if mid not in self._promises:
                        want.append(mid)
                    else:
                        self._offer(mid, peer)
                    if race is not None:
                        race[0] += 1
                else:
                    if (
                        entry.state == ACCEPTED
                        and not entry.flooded
                        and (
                            peer not in entry.sent_to or now - entry.at < self._rtt.get(peer, self.p.near_first_window)
                        )
                    ):
                        self.scores.forwarded(peer, topic)
                    if race is not None:
                        race[1] += 1
                        race[2] += now - entry.at
            room = self.p.max_iwant_ids - self._asked.get(peer, 0)
            want = want[: max(room, 0)]
            if want:
                self._asked[peer] = self._asked.get(peer, 0) + len(want)
                self._out(peer).iwant.extend(want)
                for mid in want:
                    self._promises[mid] = (peer, now + self.p.iwant_followup)
        return rest

    def _choose_eager(self, topic: str, mesh: set) -> None:
        """Once a heartbeat: choke the eager peer whose copies came first least often while more
        than d_eager are eager; unchoke the choked peer that came first most often when fewer
        than d_eager_min are, or when its announcements beat the eager peers."""
        p = self.p
        stats = {q: self._race.get((q, topic), [0, 0, 0.0]) for q in mesh}
        # eager peers that sent us anything lately: a peer that sends nothing is no reason to
        # choke one that does (the scores deal with it)
        eager = [
            q for q in mesh if (q, topic) not in self._choking and stats[q][0] + stats[q][1] and q not in self.plain
        ]
        choked = [q for q in mesh if (q, topic) in self._choking]
        if len(eager) > p.d_eager:
            # the fewest firsts, then the latest copies on average
            ranked = sorted(
                (q for q in eager if stats[q][0] + stats[q][1] >= p.choke_after),
                key=lambda q: (stats[q][0] / (stats[q][0] + stats[q][1]), -stats[q][2] / max(stats[q][1], 1)),
            )
            slow = ranked[: len(eager) - p.d_eager]
            for q in slow:
                self._choking.add((q, topic))
                self._out(q).choke.append(topic)
                self._race[(q, topic)] = [0, 0, 0.0]
            if slow:
                return
        if choked:
            fast = max(choked, key=lambda q: (stats[q][0], -stats[q][1]))
            worst = min((stats[q][0] for q in eager), default=0)
            if len(eager) < p.d_eager_min or stats[fast][0] > max(worst, 2):
                self._choking.discard((fast, topic))
                self._out(fast).unchoke.append(topic)
                self._race[(fast, topic)] = [0, 0, 0.0]

    def _unmesh(self, peer: Hashable, topic: str) -> None:
        self._choked_by.discard((peer, topic))
        self._choking.discard((peer, topic))
        self._race.pop((peer, topic), None)

    def _flush_announce(self) -> None:
        """The eager IHAVEs to the peers that choked us join their batches."""
        if self._announce:
            for peer, topics in self._announce.items():
                self._out(peer).ihave.extend(topics.items())
            self._announce = {}
