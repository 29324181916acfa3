"""One replica's checkpoints (docs/crdt.md, Compaction): proposing one when its turn comes
(lattica/crdt/_compaction.py says when), gathering the signatures that settle it, telling the
replica peers, and taking a settled one, ours or a peer's: checked against our own log if we hold
what it covers, else taken on its signatures with its state. The rules (what a checkpoint covers,
whether it is right) are the replica's (lattica/crdt/_replica.py)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

from lattica.actors.crdt.wire import parse_signatures, replica_ref
from lattica.crdt._checkpoint import MAX_STATE, Checkpoint
from lattica.crdt._compaction import RETRY_AFTER, TOO_LARGE_AFTER, is_settled, proposer_turn
from lattica.crdt._replica import REBUILD_GAP
from lattica.errors import LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica.actors.crdt.replica import Replica

__all__ = ["Checkpoints"]

log = get_logger("lattica.crdt")


class Checkpoints:
    """``replica``'s checkpoint rounds, and the settled checkpoints it takes."""

    def __init__(self, replica: Replica) -> None:
        self.r = replica
        self._proposing = False
        self._propose_after = 0.0

    def states(self) -> list[bytes]:
        """The states of the checkpoints we hold, in the order the rules hold them."""
        return [self.r.cp_states[cp.digest] for cp in self.r.state.checkpoints]

    def settled(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` carries the signatures a replica that cannot check it needs."""
        r = self.r
        return is_settled(cp, r.owner, r.cfg.checkpoint_quorum, r.member_at)

    # -- proposing ----------------------------------------------------------------------------------

    def maybe_propose(self) -> None:
        """Propose a checkpoint once the log holds ``compact_every`` envelopes, if it falls to us
        (one proposer at a time, not one per replica)."""
        r = self.r
        every, held = r.cfg.compact_every, len(r.state.log)
        if not every or self._proposing or held < every or time.monotonic() < self._propose_after:
            return
        peers = [p.to_bytes() for p in r.peers()] if r.owner is None else []
        if not proposer_turn(r.me, r.owner, peers, held, every, r.cfg.checkpoint_quorum):
            return
        self._proposing = True
        r.host.spawn(self._round())

    async def _round(self) -> None:
        try:
            await self._propose()
        except Exception as exc:  # (whatever a peer's answer did: back off, never retry at once)
            log.info("crdt checkpoint round failed", doc=self.r.name, error=repr(exc))
            self._propose_after = time.monotonic() + RETRY_AFTER
        finally:
            self._proposing = False

    async def _propose(self) -> None:
        r = self.r
        peers = r.peers()
        random.shuffle(peers)
        # first what they hold and we lack (and their checkpoints): the proposal covers it
        await asyncio.gather(*(r.anti_entropy.sync_with(p) for p in peers), return_exceptions=True)
        if r.closed:
            return
        made = r.state.propose(self.states())
        if made is None:
            self._propose_after = time.monotonic() + REBUILD_GAP
            return
        cp, canon = made
        if len(canon) > MAX_STATE:
            log.warning("crdt document too large to checkpoint", doc=r.name, state_bytes=len(canon))
            self._propose_after = time.monotonic() + TOO_LARGE_AFTER
            return
        cp = cp.signed(r.host.keypair, r.certs())
        for peer in peers:
            if self.settled(cp):
                break
            try:
                await r.anti_entropy.sync_with(peer)  # (it holds what we hold: it can check the checkpoint)
                answer = await r.rt.call(
                    replica_ref(peer, r.doc), "checkpoint", (cp.to_bytes(), None), {}, timeout=10.0
                )
            except LatticaError as exc:
                log.debug("crdt checkpoint not signed by a peer", doc=r.name, peer=peer.short(), error=str(exc))
                continue
            # (its own signature only, and only one that verifies: junk cannot fill the slots)
            theirs = [sig for sig in parse_signatures(answer) if sig.signer == peer.to_bytes()]
            if theirs and Checkpoint(cp.doc, cp.heads, cp.state_hash, tuple(theirs[:1])).valid_signatures():
                cp = cp.with_signatures(theirs[:1])
        if r.closed:
            return
        if not self.settled(cp):
            self._propose_after = time.monotonic() + RETRY_AFTER
            log.info("crdt checkpoint not signed by enough members yet", doc=r.name, signatures=len(cp.signatures))
            return
        why = self._take_checked(cp, None)
        if why:
            log.info("crdt checkpoint not taken", doc=r.name, reason=why)
            return
        for peer in r.peers():
            r.host.spawn(self._announce(peer, cp))

    async def _announce(self, peer: PeerId, cp: Checkpoint) -> None:
        r = self.r
        try:
            await r.rt.call(replica_ref(peer, r.doc), "checkpoint", (cp.to_bytes(), None), {}, timeout=10.0)
        except LatticaError as exc:
            log.debug("crdt checkpoint not announced", doc=r.name, peer=peer.short(), error=str(exc))

    # -- taking -------------------------------------------------------------------------------------

    def from_peer(self, cp: Checkpoint, state: bytes | None, via: PeerId | None) -> str:
        """A settled checkpoint a peer gave: take it (or fetch its state by a sync if we cannot
        check it without). Why not ("" if taken)."""
        r = self.r
        if any(cp.digest == have.digest for have in r.state.checkpoints):
            return ""
        if not self.settled(cp):
            why = "checkpoint without the signatures it needs"
        else:
            why = self._take_checked(cp, state, via)
            if why == "we do not hold everything it covers":
                if via is not None:
                    r.anti_entropy.sync_soon(via)  # (its answer brings the checkpoint's state)
                return why
        if why:
            r.refused += 1
            r.state.refused_total["checkpoint: " + why] += 1
            log.info("crdt checkpoint refused", doc=r.name, reason=why, via=via.short() if via else None)
        return why

    def _take_checked(self, cp: Checkpoint, state: bytes | None, via: PeerId | None = None) -> str:
        """Take ``cp`` (settled): checked against our own log if we hold what it covers, else,
        with its ``state``, on its signatures. Why not ("" if taken)."""
        r = self.r
        if any(cp.digest == have.digest for have in r.state.checkpoints):
            return ""
        if r.state.superseded(cp):
            return ""
        why, canon = r.state.check(cp, self.states())
        if why in ("it disagrees with an envelope we hold", "it covers a forked chain past its end"):
            # its author forked and the checkpoint, settled, names the other branch: that one
            # counts (the replicas that took it hold nothing else): ours goes, and the document
            # is rebuilt without it before the checkpoint is taken
            if r.state.disagreeing(cp) and time.monotonic() - r.rebuilt_at < REBUILD_GAP:
                return "a rebuild was made less than a second ago"  # (offered again by a later sync)
            if r.state.yield_to(cp):
                r.rebuild()
            why = "we do not hold everything it covers"  # (the branch it names: taken on its signatures)
        merge = False
        if why == "we do not hold everything it covers" and state is not None:
            seq = next((s for a, n, s, _ in cp.heads if (a, n) == r.chain), 0)
            if seq > r.state.head(r.chain)[0]:
                return "it covers more of our own chain than we signed"
            canon, merge, why = state, True, ""
        if why:
            return why
        old = {c.digest for c in r.state.checkpoints}
        why, out = r.state.adopt(cp, canon)
        if why:
            return why
        r.cp_states = {c.digest: r.cp_states.get(c.digest, canon) for c in r.state.checkpoints}
        if merge:
            r.apply_update(canon, learn=True)  # (Yjs merges: what we held and what it holds)
        r.checkpoints_taken += 1
        r.log_bytes = sum(e.size for e in r.state.log.all()) + sum(len(st) for st in r.cp_states.values())
        r.storage.compact(cp, canon, list(old - set(r.cp_states)))
        log.info(
            "crdt checkpoint taken",
            doc=r.name,
            chains=len(cp.heads),
            state_bytes=len(canon),
            log_envelopes=len(r.state.log),
            checked=not merge,
        )
        r.act_on(out, via)
        return ""
