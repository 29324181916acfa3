"""One replica's glue to the node's store (lattica/crdt/_store.py, SQLite on its own thread): what
it takes back when the document opens, the envelopes it applies, snapshots of the document's
state, checkpoints taken, and the chain it writes under. Without a store (``path="memory"``)
each of these does nothing. A write that fails is logged (the store's own thread runs it)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica.actors.crdt.replica import Replica
    from lattica.crdt._checkpoint import Checkpoint
    from lattica.crdt._envelope import Envelope

__all__ = ["Storage"]

log = get_logger("lattica.crdt")


class Storage:
    """``replica``'s writes to the store, and what it reads back from it."""

    def __init__(self, replica: Replica) -> None:
        self.r = replica
        self.durable: asyncio.Future | None = None  # the store's write of what we applied last
        self._since_snapshot = 0

    async def load(self) -> tuple[bytes | None, Any, list, list]:
        """What the store holds of the document: the nonce of the chain we wrote under, the
        last snapshot ``(log position, state, meta)``, the log ``(position, envelope)`` and our
        checkpoints ``(checkpoint, state)`` (None, None, [], [] if nothing)."""
        store = self.r.svc.store
        if store is None:
            return None, None, [], []
        return await asyncio.wrap_future(store.load(self.r.doc))

    async def remember(self, clean: bool) -> None:
        """Record the document (name, owner) and the chain we write under; ``clean``: everything
        we signed is written (the chain may go on next time)."""
        r = self.r
        if r.svc.store is not None:
            await asyncio.wrap_future(r.svc.store.remember(r.doc, r.name, r.owner, r.nonce, clean=clean))

    def remember_soon(self, clean: bool) -> None:
        """:meth:`remember`, not waited for."""
        r = self.r
        if r.svc.store is not None:
            r.svc.store.remember(r.doc, r.name, r.owner, r.nonce, clean=clean).add_done_callback(_logged_failure)

    def append(self, envs: list[Envelope]) -> None:
        """Log the envelopes just applied (and snapshot every ``snapshot_every`` of them)."""
        store = self.r.svc.store
        if store is None:
            return
        self.durable = asyncio.wrap_future(store.append(self.r.doc, envs))
        self.durable.add_done_callback(_logged_failure)
        self._since_snapshot += len(envs)
        if self._since_snapshot >= self.r.cfg.snapshot_every:
            self.snapshot()

    def snapshot(self) -> None:
        """Record the document's state now, so reopening it replays only what comes after."""
        r = self.r
        store = r.svc.store
        if store is None or r.ydoc is None:
            return
        self._since_snapshot = 0
        with r.txn():
            state = r.ydoc.get_update()
        store.snapshot(r.doc, state, [r.state.export(), r.roots]).add_done_callback(_logged_failure)

    def compact(self, cp: Checkpoint, canon: bytes, dropped: list[bytes]) -> None:
        """Record the checkpoint ``cp`` just taken (``canon``: its state) with a new snapshot, in
        one transaction: the envelopes it covers and the checkpoints ``dropped`` (digests) go."""
        r = self.r
        store = r.svc.store
        if store is None or r.ydoc is None:
            return
        self._since_snapshot = 0
        with r.txn():
            snap = r.ydoc.get_update()
        store.compact(
            r.doc,
            cp.to_bytes(),
            cp.digest,
            canon,
            dict(r.state.base),
            dropped,
            (snap, [r.state.export(), r.roots]),
        ).add_done_callback(_logged_failure)


def _logged_failure(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("crdt store write failed", error=repr(fut.exception()))
