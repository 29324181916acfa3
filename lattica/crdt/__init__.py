"""Replicated documents (docs/crdt.md): pycrdt documents that every node opening them holds a
replica of, kept in step over pub-sub and anti-entropy, every change signed and checked.

    doc = lattica.crdt.open("swarm/config")            # a mesh document: every member writes
    with doc.transaction():
        doc.map("layers")["0-15"] = "node-a"
    doc.commit(replicas=1).result()                     # on disk here and held by one more replica
    doc.to_py()

``owner=`` (a PeerId, or True for this node) makes a document only its owner and the writers it
lists may change. The sans-IO parts: ``envelope`` (what is signed), ``replica`` (what a replica
accepts), ``yupdate`` (what a Yjs update writes); ``store`` keeps them in SQLite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica._future import Future
from lattica._identity import PeerId
from lattica._runtime import on_loop, run_coroutine
from lattica.errors import NodeClosed

if TYPE_CHECKING:
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.crdt import CrdtService

__all__ = ["open", "list"]

_list = list


def _service(node: Node | None) -> tuple[Runtime, CrdtService]:
    # the table imports every service, and services import parts of this package
    from lattica.services import running_services

    rt, services = running_services(node)
    if services.crdt is None:
        raise NodeClosed("this node runs without the CRDT store (Node(crdt=False))")
    if services.pubsub is None:
        raise NodeClosed("the CRDT store replicates over pub-sub: this node runs without it (Node(pubsub=False))")
    return rt, services.crdt


def open(
    name: str,
    owner: PeerId | str | bool | None = None,
    writers: _list[PeerId | str] | None = None,
    *,
    node: Node | None = None,
    block: bool = True,
    timeout: float = 30.0,
) -> Any:
    """This node's replica of document ``name`` (opened once per node; it comes back from disk
    if the node held it before). ``owner``: None for a mesh document every member writes; a
    PeerId (True: this node) for one only its owner and ``writers`` change (``writers`` is the
    owner's to set). ``block=False``: a Future of the Document instead."""
    from lattica.crdt._document import Document  # (pycrdt's types come with it: loaded at the first document)

    rt, svc = _service(node)
    if owner is True:
        owner = rt.peer_id
    elif isinstance(owner, str):
        owner = PeerId.from_string(owner)
    elif owner is False:
        owner = None
    peers = None if writers is None else [PeerId.from_string(w) if isinstance(w, str) else w for w in writers]
    fut: Future = run_coroutine(rt, lambda: svc.open(name, owner, peers), lambda replica: Document(replica, rt, svc))
    return fut.result(timeout) if block else fut


def list(*, node: Node | None = None) -> _list[str]:
    """The names of the documents open on this node."""
    rt, svc = _service(node)
    names: _list[str] = on_loop(rt, svc.list)
    return names
