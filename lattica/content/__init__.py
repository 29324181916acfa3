"""The content plane: bytes named by their hash (CIDs), chunked into UnixFS objects, kept in a
blockstore and fetched Bitswap-style from every peer that holds them (docs/content.md).

Every function returns a :class:`lattica.Future` (``await`` it, or ``.result()`` in sync code) and
runs on the default node (``lattica.init``'s, or the node whose actor calls) unless ``node=``::

    cid = lattica.content.put(b"...").result()           # chunk, hash, store, pin, announce
    data = lattica.content.get(cid).result()             # from whoever holds it, verified
    lattica.content.get(cid, path="model.bin").result()  # straight to a file
    cid = lattica.content.put_weights({"w": array}).result()
    arrays = lattica.content.get_weights(cid).result()   # memory-mapped where on disk
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from lattica._future import Future
from lattica._runtime import run_coroutine
from lattica.content._cid import Cid
from lattica.errors import NodeClosed

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.content import ContentService

__all__ = ["Cid", "put", "get", "pin", "unpin", "stat", "providers", "gc", "put_weights", "get_weights"]


def _service(node: Node | None) -> tuple[Runtime, ContentService]:
    # the table imports every service, and services import parts of this package
    from lattica.services import running_services

    rt, services = running_services(node)
    if services.content is None:
        raise NodeClosed("this node runs without the content service (Node(content=False))")
    return rt, services.content


def _source(data: Any) -> Any:
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    array = getattr(data, "__array_interface__", None)
    if array is not None:  # a numpy array (any C-contiguous buffer): its bytes, without a copy
        import numpy as np  # numpy is loaded whenever an array exists

        # (an ndarray is a buffer; numpy declares its __buffer__ only for Python >= 3.12)
        return memoryview(cast("Buffer", np.ascontiguousarray(data))).cast("B")
    raise TypeError(f"put takes bytes, a file path or a numpy array, not {type(data).__name__}")


def put(
    data: Any,
    *,
    chunk_size: int | None = None,
    pin: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    node: Node | None = None,
) -> Future:
    """Store ``data`` (bytes, a file path, or a numpy array's bytes) as a UnixFS object, pin it and
    announce it to the DHT; resolves to its CID text (``bafk...`` for one block, ``bafy...``
    otherwise: what ``ipfs add --cid-version 1 --raw-leaves --chunker size-N`` gives).
    ``progress`` gets ``{bytes, total, mb_per_s, done}`` as the data is hashed and stored."""
    rt, svc = _service(node)
    source = _source(data)
    return run_coroutine(rt, lambda: svc.put(source, chunk_size, pin, progress), str)


def get(
    cid: str | Cid,
    *,
    path: str | os.PathLike[str] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    node: Node | None = None,
) -> Future:
    """Fetch the object ``cid`` from whoever holds it (every block verified against its CID);
    resolves to its bytes, or with ``path`` writes it there (atomically) and resolves to the
    path. ``progress`` is called on the node's loop with ``{bytes, held, total, mb_per_s, peers, ...}``
    (``bytes`` counts what was held before, ``held``: a resumed get starts there).
    BlockNotFound if no provider is found within ``ContentConfig.find_timeout``; ContentError
    for an object over ``ContentConfig.max_get_bytes`` without ``path``."""
    root = Cid.parse(cid)
    rt, svc = _service(node)

    async def go() -> Any:
        await svc.fetch(root, progress, None if path is not None else svc.cfg.max_get_bytes)
        if path is not None:
            return await svc.write(root, os.fspath(path))
        return await svc.read(root)

    return run_coroutine(rt, go)


def pin(
    cid: str | Cid, *, progress: Callable[[dict[str, Any]], None] | None = None, node: Node | None = None
) -> Future:
    """Keep the object ``cid`` (fetched first if missing) out of garbage collection;
    ``progress`` as for :func:`get` (called while it is fetched)."""
    root = Cid.parse(cid)
    rt, svc = _service(node)

    async def go() -> None:
        await svc.fetch(root, progress)
        await svc.pin(root)

    return run_coroutine(rt, go)


def unpin(cid: str | Cid, *, node: Node | None = None) -> Future:
    """Let the object ``cid`` be collected again; resolves to whether it was pinned."""
    root = Cid.parse(cid)
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.unpin(root))


def stat(cid: str | Cid | None = None, *, node: Node | None = None) -> Future:
    """What the blockstore holds (no ``cid``), or of object ``cid``: its size, blocks held,
    whether complete and pinned (nothing is fetched)."""
    root = Cid.parse(cid) if cid is not None else None
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.stat(root))


def providers(cid: str | Cid, *, count: int = 20, node: Node | None = None) -> Future:
    """Up to ``count`` PeerIds that announced ``cid`` in the DHT."""
    root = Cid.parse(cid)
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.providers(root, count))


def gc(*, node: Node | None = None) -> Future:
    """Collect every unpinned block now; resolves to ``{"blocks": n, "bytes": n}`` freed."""
    rt, svc = _service(node)
    return run_coroutine(rt, svc.gc)


def put_weights(
    weights: Mapping[str, Any],
    *,
    metadata: Mapping[str, str] | None = None,
    chunk_size: int | None = None,
    node: Node | None = None,
) -> Future:
    """Write ``weights`` (name -> numpy array or torch tensor) as a safetensors file and ``put``
    it; resolves to its CID text."""
    from lattica.content import _weights as _weights  # safetensors loads only when weights are written

    rt, svc = _service(node)
    blob = _weights.encode(weights, metadata)
    return run_coroutine(rt, lambda: svc.put(blob, chunk_size, True), str)


def get_weights(cid: str | Cid, *, node: Node | None = None) -> Future:
    """The arrays of the safetensors object ``cid`` (fetched if missing), memory-mapped read-only
    from a file next to the blockstore when it is on disk."""
    root = Cid.parse(cid)
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.weights(root))
