"""The content service's hashing and disk work, run on worker threads (at 800 MB/s it would take
the node loop's core): importing, reading and storing blocks, walking a stored object."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica.content import _dagpb as dagpb
from lattica.content._cid import RAW, Cid
from lattica.content._unixfs import CHUNK_MAX, Importer, UnixFSData, children, walk
from lattica.errors import BadBlock, BlockNotFound, ContentError

if TYPE_CHECKING:
    from lattica.content._blockstore import Blockstore

__all__ = ["import_source", "read_blocks", "dag", "stat", "held_bytes", "check_and_store", "read_all", "write_file"]


def import_source(
    store: Blockstore, source: Any, chunk: int, progress: Callable[[int, int], None] | None = None
) -> tuple[Cid, list[Cid]]:
    """Chunk, hash and store ``source`` (bytes-like or a file path); ``progress(done, total)``
    after each piece read (bytes)."""
    importer = Importer(chunk)
    cids: list[Cid] = []

    def keep(blocks: list) -> None:
        for cid, block in blocks:
            store.put(cid, block, verified=True)
            cids.append(cid)

    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            done = 0
            while True:
                piece = f.read(max(chunk, 1 << 20) * 4)
                if not piece:
                    break
                keep(importer.feed(piece))
                done += len(piece)
                if progress is not None:
                    progress(done, max(total, done))
    else:
        keep(importer.feed(source))
        if progress is not None:
            progress(len(memoryview(source).cast("B")), len(memoryview(source).cast("B")))
    root, last = importer.finish()
    keep(last)
    return root, cids


def read_blocks(store: Blockstore, cids: list[Cid], budget: int) -> list:
    out: list = []
    for cid in cids:
        try:
            block = store.get(cid)
        except BlockNotFound:
            out.append(None)
            continue
        if out and len(block) > budget:
            break  # the rest: ask again
        budget -= len(block)
        out.append(block)
    return out


def dag(store: Blockstore, root: Cid) -> list[Cid]:
    """Every CID of the object ``root`` (BlockNotFound if a block is missing)."""
    out, todo, seen = [], [root], set()
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        out.append(cid)
        if cid.codec != RAW:
            todo.extend(children(cid, store.get(cid)))
    return out


def stat(store: Blockstore, root: Cid) -> dict:
    held, blocks, todo, seen, size = 0, 0, [root], set(), None
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        blocks += 1
        try:
            block = store.get(cid)
        except BlockNotFound:
            continue
        held += 1
        if cid.codec != RAW:
            if cid == root:
                size = UnixFSData.decode(dagpb.decode(block).data or b"").filesize
            todo.extend(children(cid, block))
        elif cid == root:
            size = len(block)
    return {
        "cid": str(root),
        "size": size,
        "blocks_known": blocks,
        "blocks_held": held,
        "complete": held == blocks and size is not None,
        "pinned": store.is_pinned(root),
    }


def held_bytes(store: Blockstore, root: Cid) -> int:
    """The bytes of ``root``'s leaves the blockstore holds (where a resumed fetch starts): only
    the inner nodes are read, a leaf's size comes from the blockstore's index."""
    held, todo, seen = 0, [root], set()
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        try:
            if cid.codec == RAW:
                held += store.size_of(cid)
            else:
                todo.extend(children(cid, store.get(cid)))
        except (BlockNotFound, BadBlock):
            continue  # (not held, or not a node the walker would take: fetched and checked then)
    return held


def check_and_store(store: Blockstore, pairs: list[tuple[Cid, Any]]) -> list:
    """Per block: True (it matches its CID, and is stored), False (it does not), or the OSError
    or ContentError storing it raised."""
    out: list = []
    for cid, block in pairs:
        if len(block) > (CHUNK_MAX if cid.codec == RAW else dagpb.MAX_BLOCK) or not cid.verify(
            block
        ):  # (no hashing of what is too big)
            out.append(False)
            continue
        try:
            store.put(cid, block, verified=True)
        except BadBlock:
            out.append(False)  # over the size limit
            continue
        except (ContentError, OSError) as e:
            out.append(e)
            continue
        out.append(True)
    return out


def read_all(store: Blockstore, root: Cid) -> bytes:
    return b"".join(piece for _, piece in walk(root, store.get, verified=True))


def read_into(store: Blockstore, root: Cid, size: int) -> bytearray:
    """The object ``root`` of ``size`` bytes in a new bytearray, each piece copied once (a
    spilled value, writable as the codec's arrays are); ContentError if it is not that size."""
    out = bytearray(size)
    at = 0
    for _, piece in walk(root, store.get, verified=True):
        n = len(piece)
        if at + n > size:
            raise ContentError(f"{root} holds more than the {size} bytes it was said to")
        out[at : at + n] = piece
        at += n
    if at != size:
        raise ContentError(f"{root} holds {at} bytes, not the {size} it was said to")
    return out


def write_file(store: Blockstore, root: Cid, path: str) -> str:
    target = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".lattica-get-", dir=os.path.dirname(target) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            for _, piece in walk(root, store.get, verified=True):
                f.write(piece)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
