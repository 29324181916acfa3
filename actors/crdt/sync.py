"""One replica's anti-entropy (docs/crdt.md, Replication): exchanging summaries with a replica
peer's actor (``sync``), taking the envelopes and checkpoints it answers, and pushing what it
lacks (``push``, ``checkpoint``), a page at a time, until neither lacks anything of the other's.
Whom to sync with and when is lattica/crdt/_antientropy.py's; the answers to peers' calls are
the replica actor's (actors/crdt/actor.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from lattica.actors.crdt.wire import (
    MAX_CHECKPOINTS_SENT,
    MAX_PUSH,
    PAGE_BYTES,
    parse_answer,
    parse_summary,
    replica_ref,
    summary_wire,
)
from lattica.crdt._antientropy import SyncSchedule
from lattica.errors import LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.refs import ActorRef
    from lattica.actors.crdt.replica import Replica
    from lattica.crdt._envelope import Envelope

__all__ = ["AntiEntropy"]

log = get_logger("lattica.crdt")


class AntiEntropy:
    """``replica``'s syncs with its replica peers: one at a time per peer (a sync wanted while
    one runs is made again once it ends), and the loop that starts them on schedule."""

    def __init__(self, replica: Replica) -> None:
        self.r = replica
        self.schedule = SyncSchedule(replica.cfg.sync_interval)
        self._again: set[PeerId] = set()  # peers to sync with once more when the sync under way ends
        self._syncing: dict[PeerId, asyncio.Task] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.r.host.spawn(self._run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in self._syncing.values():
            t.cancel()

    def sync_soon(self, peer: PeerId) -> None:
        if self.r.closed:
            return
        if peer in self._syncing:
            self._again.add(peer)  # (what made us want it may have come after that sync's question)
            return
        self._syncing[peer] = self.r.host.spawn(self._sync_task(peer))

    def spread(self, applied: list[Envelope], via: PeerId | None) -> None:
        """Pass envelopes anti-entropy brought on to the replica peers that lack them, as far as
        we know."""
        for peer in self.schedule.lacking(applied, via):
            self.sync_soon(peer)

    async def _sync_task(self, peer: PeerId) -> None:
        try:
            for _ in range(8):
                self._again.discard(peer)
                await self.sync_with(peer)
                if peer not in self._again:
                    break
        except LatticaError as exc:
            log.debug("crdt anti-entropy failed", doc=self.r.name, peer=peer.short(), error=str(exc))
        finally:
            self._syncing.pop(peer, None)
            self._again.discard(peer)

    async def sync_with(self, peer: PeerId, timeout: float = 10.0) -> dict:
        """Exchange what we hold with ``peer``'s replica until neither lacks anything of the
        other's (as far as a round shows); its summary."""
        r = self.r
        ref = replica_ref(peer, r.doc)
        for _ in range(16):  # pages of at most PAGE_BYTES each way
            answer = await r.rt.call(ref, "sync", (summary_wire(r.state),), {}, timeout=timeout)
            ids: dict = {}
            theirs, envs, given = parse_answer(answer, ids)
            self.schedule.heard(peer, theirs)
            for cp, state in given:  # (we lack what it dropped for them: they come first)
                r.checkpoints.from_peer(cp, state, peer)
            if envs:
                r.receive(envs, peer)
            theirs = await self._push_missing(ref, theirs, timeout, ids)
            self.schedule.heard(peer, theirs)
            if not given and len(envs) < MAX_PUSH and sum(e.size for e in envs) < PAGE_BYTES:
                self.schedule.synced.add(peer)
                return theirs
        return theirs

    async def _push_missing(self, ref: ActorRef, theirs: dict, timeout: float, ids: dict | None = None) -> dict:
        r = self.r
        for cp in r.state.checkpoints_for(theirs)[:MAX_CHECKPOINTS_SENT]:  # (it lacks what we dropped for them)
            answer = await r.rt.call(ref, "checkpoint", (cp.to_bytes(), r.cp_states[cp.digest]), {}, timeout=timeout)
            theirs = parse_summary(answer[1] if type(answer) is list and len(answer) == 2 else None)
        # it holds chains we ended past their end (it should end them too), or another envelope
        # than ours at a head: it should see the fork
        proofs = r.state.proofs_for(theirs) + r.state.differing(theirs, ids or {})
        for _ in range(16):
            missing = (proofs + r.state.missing_for(theirs, PAGE_BYTES))[:MAX_PUSH]
            proofs = []
            if not missing:
                break
            answer = await r.rt.call(ref, "push", ([e.to_bytes() for e in missing],), {}, timeout=timeout)
            after = parse_summary(answer)
            if not any(after.get(e.chain, 0) >= e.seq for e in missing):
                break  # it took none of them (refused, or waiting on what we do not hold): stop rather than loop
            theirs = after
        return theirs

    async def _run(self) -> None:
        """Sync with every new replica peer as it appears, and with a random one every
        ``sync_interval`` seconds (as the schedule says); propose a checkpoint when it is due."""
        r = self.r
        self.schedule.start(time.monotonic())
        while not r.closed:
            await asyncio.sleep(self.schedule.tick)
            for peer in self.schedule.due(r.peers(), time.monotonic()):
                self.sync_soon(peer)
            r.checkpoints.maybe_propose()
