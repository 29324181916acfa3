"""The replica actor ``crdt/<document id>``: what a document's other replicas call on this node's
replica (members only): ``sync`` and ``push`` (anti-entropy), ``checkpoint`` (a proposal to
sign, or a settled checkpoint to take). Each call is within a per-peer budget, and the bytes
``sync`` answers one peer are too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica._runtime import current_caller
from lattica.actors.crdt.wire import (
    MAX_BODY,
    MAX_CHECKPOINTS_SENT,
    MAX_PUSH,
    PAGE_BYTES,
    parse_summary,
    summary_wire,
)
from lattica.crdt._checkpoint import MAX_STATE, Checkpoint
from lattica.crdt._envelope import decode_any
from lattica.errors import MalformedUpdate, PermissionDenied, ProtocolError

if TYPE_CHECKING:
    from lattica.actors.crdt.replica import Replica

__all__ = ["ReplicaActor"]


class ReplicaActor:
    """What a document's other replicas call (members only): ``sync``, ``push`` and ``checkpoint``."""

    def __init__(self, replica: Replica) -> None:
        self._r = replica

    async def sync(self, summary: list) -> list:
        """``summary``: what the caller holds per chain. Answers ours, and the envelopes the
        caller lacks (a page of them: it calls again until a short page)."""
        ids: dict = {}
        theirs = parse_summary(summary, ids)
        r = self._r
        caller = current_caller()
        if caller is not None and not r._sync_calls.take(caller):
            raise PermissionDenied(f"{caller} asks {r.rt.peer_id} to sync {r.name!r} too often")
        if caller is not None and r._sync_bytes.wait(caller) > 0:
            raise PermissionDenied(f"{caller} had {r.rt.peer_id} send more of {r.name!r} than it sends a peer a second")
        missing = (
            r.state.proofs_for(theirs) + r.state.differing(theirs, ids) + r.state.missing_for(theirs, PAGE_BYTES)
        )[:MAX_PUSH]
        given = [
            [cp.to_bytes(), r.cp_states[cp.digest]] for cp in r.state.checkpoints_for(theirs)[:MAX_CHECKPOINTS_SENT]
        ]
        if caller is not None:  # (into debt: the next answer waits until it is paid off)
            r._sync_bytes.take(caller, sum(e.size for e in missing) + sum(len(g[1]) for g in given), force=True)
        if caller is not None and caller != r.rt.peer_id:
            r.anti_entropy.schedule.answered(caller, theirs, missing)  # (it syncs with us: we need not start one)
            if any(r.state.head(c)[0] < s for c, s in theirs.items()):
                r.anti_entropy.sync_soon(caller)  # it holds what we lack: push it here
        return [summary_wire(r.state), [e.to_bytes() for e in missing], given]

    async def push(self, envs: list) -> list:
        """Envelopes the caller found we lack; answers what we hold afterwards."""
        if type(envs) is not list or len(envs) > MAX_PUSH:
            raise ProtocolError(f"a push is a list of at most {MAX_PUSH} envelopes")
        r = self._r
        caller = current_caller()
        if caller is not None and not r._sync_calls.take(caller):
            raise PermissionDenied(f"{caller} pushes to {r.rt.peer_id}'s {r.name!r} too often")
        decoded = []
        for raw in envs:
            try:
                decoded.append(decode_any(raw, MAX_BODY))
            except MalformedUpdate:
                r.count_malformed()
        if caller is not None:
            r.anti_entropy.schedule.pushed(caller, decoded)
        r.receive(decoded, caller)
        return summary_wire(r.state)

    async def checkpoint(self, raw: Any, state: Any = None) -> list:
        """A checkpoint: proposed (``state`` None, not yet settled: we check it against our log
        and answer our signature if it is right), or settled (we take it; ``state`` for a replica
        that lacks what it covers). Answers ``[our signatures, our summary]``."""
        r = self._r
        caller = current_caller()
        if caller is not None and not (r._cp_calls.take(caller) and r._cp_calls_all.take()):
            raise PermissionDenied(f"{caller} sends {r.rt.peer_id} checkpoints of {r.name!r} too often")
        if type(state) is memoryview:  # (large bytes arrive out of band, as a view)
            state = state.tobytes()
        if state is not None and (type(state) is not bytes or len(state) > MAX_STATE):
            raise ProtocolError(f"a checkpoint's state is bytes, at most {MAX_STATE}")
        try:
            cp = Checkpoint.from_bytes(raw)
        except MalformedUpdate as exc:
            r.count_malformed("checkpoint")
            raise ProtocolError(str(exc)) from None
        if cp.doc != r.doc:
            raise ProtocolError("a checkpoint of another document")
        mine: list = []
        wrong = r.state.disagreeing(cp)
        if wrong and caller is not None:  # (its author signed two envelopes for one place: show the caller ours)
            r.host.spawn(r.tell(caller, wrong[:MAX_PUSH]))
        if state is None and not r.checkpoints.settled(cp):
            why, _ = r.state.check(cp, r.checkpoints.states())
            if not why:
                mine = [
                    [s.signer, s.ts, list(s.certs), s.sig]
                    for s in cp.signed(r.host.keypair, r.certs()).signatures
                    if s.signer == r.me
                ]
            elif why == "we do not hold everything it covers" and caller is not None:
                r.anti_entropy.sync_soon(caller)
        else:
            r.checkpoints.from_peer(cp, state, caller)
        return [mine, summary_wire(r.state)]
