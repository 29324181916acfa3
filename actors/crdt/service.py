"""The ``crdt`` service: the documents a node holds open, and the store they persist in.

Opening a document (``lattica.crdt.open``) makes its replica (``actors/crdt/replica.py``): it
comes back from the store if the node held it before, joins the document's pub-sub topic and
starts anti-entropy with the other replicas it finds there. The store (SQLite, one per node) is
opened at the first document, so a node that never opens one pays nothing.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from lattica._identity import PeerId
from lattica.config import CrdtConfig
from lattica.errors import CrdtError, NotAWriter
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.crdt.replica import Replica
    from lattica.actors.pubsub import PubSubService
    from lattica.crdt._store import Store

__all__ = ["CrdtService"]

log = get_logger("lattica.crdt")

MAX_DOCUMENTS = 1024  # open at once on one node
MAX_NAME = 256  # bytes of a document's name


class CrdtService:
    """A node's open documents and their store (pycrdt and SQLite load at the first one)."""

    def __init__(self, runtime: Calls, config: CrdtConfig, pubsub: PubSubService) -> None:
        self.rt = runtime
        self.pubsub = pubsub  # documents' live updates travel over it
        self.host = runtime.host
        self.cfg = config
        self.docs: dict[bytes, Replica] = {}
        self._opening: dict[bytes, asyncio.Future[Replica]] = {}
        self.store: Store | None = None
        self._store_ready: asyncio.Future | None = None
        self._private_dir: str | None = None
        self._closed = False
        self.host.events.disconnected.subscribe(self._on_disconnected)

    def _on_disconnected(self, peer: PeerId, conn: object) -> None:
        for replica in self.docs.values():
            # (met again, it is synced with again: what it missed meanwhile)
            replica.anti_entropy.schedule.synced.discard(peer)

    async def _open_store(self) -> None:
        where = (
            self.cfg.path or os.environ.get("LATTICA_CRDT") or os.path.join(os.path.expanduser("~"), ".lattica", "crdt")
        )
        if where == "memory":
            return
        from lattica.crdt._store import Store  # (loaded at the first document: start-up time)

        loop = asyncio.get_running_loop()
        try:
            self.store = await loop.run_in_executor(None, Store, os.path.join(where, "crdt.sqlite"), self.cfg.fsync)
        except CrdtError as exc:
            if self.cfg.path is not None or "in use" not in str(exc):
                raise
            import tempfile  # (only when the default store is taken)

            self._private_dir = tempfile.mkdtemp(prefix=f"lattica-crdt-{self.host.peer_id.short()}-")
            log.info(
                "default CRDT store in use; using a private one until this node stops",
                default=where,
                private=self._private_dir,
            )
            self.store = await loop.run_in_executor(
                None, Store, os.path.join(self._private_dir, "crdt.sqlite"), self.cfg.fsync
            )

    async def open(self, name: str, owner: PeerId | None = None, writers: list[PeerId] | None = None) -> Replica:
        """The replica of document ``name`` (owned by ``owner``; None: a mesh document any
        member writes), opened once per node; ``writers`` (the owner only) sets its list."""
        if self._closed:
            raise CrdtError("the CRDT service is closed")
        if type(name) is not str or not name or len(name.encode()) > MAX_NAME:
            raise ValueError(f"a document's name is a non-empty string of at most {MAX_NAME} bytes")
        if writers is not None and owner is None:
            raise ValueError("a mesh document (owner=None) has no writers list: every member writes it")
        # (hashlib and msgpack's use load with the first document: start-up time)
        from lattica.crdt._envelope import doc_id

        doc = doc_id(name, owner)
        replica = self.docs.get(doc)
        if replica is None:
            pending = self._opening.get(doc)
            if pending is None:
                if len(self.docs) + len(self._opening) >= MAX_DOCUMENTS:
                    raise CrdtError(f"{self.rt.peer_id} holds {MAX_DOCUMENTS} documents open already")
                pending = self._opening[doc] = asyncio.ensure_future(self._load(name, doc, owner))
            try:
                replica = await asyncio.shield(pending)
            finally:
                self._opening.pop(doc, None)
        if writers is not None:
            if owner != self.rt.peer_id:
                raise NotAWriter(f"only the owner of {name!r} ({owner}) sets its writers")
            replica.set_writers(list(writers))
        return replica

    async def _load(self, name: str, doc: bytes, owner: PeerId | None) -> Replica:
        if self._store_ready is None:
            self._store_ready = asyncio.ensure_future(self._open_store())
        await asyncio.shield(self._store_ready)
        from lattica.actors.crdt.replica import Replica  # (pycrdt loads at the first document: ~75 ms of start-up)

        replica = Replica(self, name, doc, owner.to_bytes() if owner is not None else None)
        await replica.load()
        self.docs[doc] = replica
        return replica

    def close_document(self, replica: Replica) -> None:
        if self.docs.get(replica.doc) is replica:
            del self.docs[replica.doc]
        replica.close()

    def list(self) -> list[str]:
        return sorted(r.name for r in self.docs.values())

    def close(self) -> None:
        self._closed = True
        for replica in list(self.docs.values()):
            try:
                replica.close()
            except Exception:
                log.exception("error while closing a document", doc=replica.name)
        self.docs.clear()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._private_dir is not None:
            import shutil  # (only to remove a private store: start-up time)

            shutil.rmtree(self._private_dir, ignore_errors=True)
