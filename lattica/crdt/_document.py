"""What ``lattica.crdt.open`` gives: a handle on this node's replica of one document, usable from
any thread (pycrdt's own transactions are thread-safe; everything else goes through the node
loop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._future import Future
from lattica._identity import PeerId
from lattica._runtime import on_loop, run_coroutine
from lattica.pubsub._subscription import Subscription

if TYPE_CHECKING:
    import pycrdt

    from lattica._runtime import Runtime
    from lattica.actors.crdt import CrdtService
    from lattica.actors.crdt.replica import Change, Replica

__all__ = ["Document"]


class Document:
    """This node's replica of a document: pycrdt types inside (``map``, ``array``, ``text``),
    changed in transactions that replicate once they end (docs/crdt.md)."""

    def __init__(self, replica: Replica, rt: Runtime, svc: CrdtService) -> None:
        self._r = replica
        self._rt = rt  # the runtime of the node that holds the replica
        self._svc = svc

    def __repr__(self) -> str:
        return f"Document({self.name!r}, owner={self.owner})"

    @property
    def name(self) -> str:
        return self._r.name

    @property
    def id(self) -> str:
        """The document's id (hex): its name and owner's."""
        return self._r.doc.hex()

    @property
    def owner(self) -> PeerId | None:
        """The owner (who decides the writers), or None: a mesh document every member writes."""
        return PeerId.from_bytes(self._r.owner) if self._r.owner else None

    @property
    def writers(self) -> list[PeerId]:
        """Who may write besides the owner (the owner's latest list this replica holds)."""
        return sorted(PeerId.from_bytes(w) for w in self._r.state.acl.writers)

    def set_writers(self, writers: list[PeerId | str]) -> None:
        """(owner) Replace the writers list, signed; a removed writer's changes made before it
        are kept."""
        peers = [PeerId.from_string(w) if isinstance(w, str) else w for w in writers]
        on_loop(self._rt, lambda: self._r.set_writers(peers))

    # -- content -------------------------------------------------------------------------------------

    def map(self, name: str) -> pycrdt.Map[Any]:
        """The root map ``name`` (made on first use)."""
        root: pycrdt.Map[Any] = self._r.root(name, "map")
        return root

    def array(self, name: str) -> pycrdt.Array[Any]:
        root: pycrdt.Array[Any] = self._r.root(name, "array")
        return root

    def text(self, name: str) -> pycrdt.Text:
        root: pycrdt.Text = self._r.root(name, "text")
        return root

    def transaction(self) -> Any:
        """``with doc.transaction(): ...``: the changes inside apply here at once and replicate as
        one envelope (NotAWriter if this node may not write). It waits for another thread's
        transaction to end: from several threads, change the document inside one (a change made
        outside any, on a pycrdt root, is a transaction of its own that pycrdt does not keep apart
        from another thread's)."""
        self._r.check_writer()
        return self._r.txn()

    def to_py(self) -> dict[str, Any]:
        """Every root as plain Python values."""
        return self._r.to_py()

    # -- replication ---------------------------------------------------------------------------------

    def commit(self, replicas: int = 0, timeout: float = 10.0) -> Future:
        """A Future that resolves once the changes made so far are on disk here and held by
        ``replicas`` other replicas (the number that confirmed); Timeout if too few do in time,
        UpdateRejected if a change could not be replicated (e.g. over ``max_update_bytes``)."""
        return run_coroutine(self._rt, lambda: self._r.commit(replicas, timeout))

    def sync(self, timeout: float = 10.0) -> Future:
        """Exchange what we hold with every known replica now (anti-entropy runs on its own too);
        resolves to the number of replicas reached."""

        async def go() -> int:
            import asyncio  # (the node loaded it long ago; this module does not need it otherwise)

            peers = self._r.peers()
            done = await asyncio.gather(
                *(self._r.anti_entropy.sync_with(p, timeout) for p in peers), return_exceptions=True
            )
            return sum(1 for d in done if isinstance(d, dict))

        return run_coroutine(self._rt, go)

    def observe(self, callback: Callable[[Change], Any]) -> Callable[[Change], Any]:
        """Call ``callback(change)`` on the node loop for every change applied here (ours once
        signed, peers' once verified); returns it, for :meth:`unobserve`."""
        on_loop(self._rt, lambda: self._r.observers.append(callback))
        return callback

    def unobserve(self, callback: Callable[[Change], Any]) -> None:
        on_loop(self._rt, lambda: self._r.observers.remove(callback) if callback in self._r.observers else None)

    def changes(self, maxsize: int = 10_000) -> Subscription:
        """The changes applied from now on (``async for change in doc.changes()``, or
        ``.get(timeout)``); the oldest are dropped past ``maxsize`` unread."""
        r = self._r

        def make() -> Subscription:
            sub = Subscription(r.name, r.host.loop, maxsize, lambda s: r.host.loop.call_soon_threadsafe(_drop, r, s))
            r._changes.append(sub)
            return sub

        sub: Subscription = on_loop(self._rt, make)
        return sub

    def peers(self) -> list[PeerId]:
        """The peers known to hold a replica of this document."""
        peers: list[PeerId] = on_loop(self._rt, self._r.peers)
        return peers

    def stats(self) -> dict[str, Any]:
        """Counts: envelopes applied and refused (by reason), forks seen, waiting, log bytes."""
        counts: dict[str, Any] = on_loop(self._rt, self._r.stats)
        return counts

    def close(self) -> None:
        """Stop replicating this document here (what it holds stays in the store)."""
        on_loop(self._rt, lambda: self._svc.close_document(self._r))


def _drop(replica: Replica, sub: Subscription) -> None:
    if sub in replica._changes:
        replica._changes.remove(sub)
    sub._end()
