"""The blockstore: the blocks a node holds, each under its CID, capped in bytes by collecting the
least recently used blocks no pin set names. ``DiskBlockstore`` is the real one (atomic, survives
SIGKILL and restarts); ``MemoryBlockstore`` has the same behaviour without a disk, for tests.

Layout of a DiskBlockstore directory::

    LOCK                       flock()ed while a store has the directory open (one store per directory)
    STATE                      JSON: boot id and start stamp of the last session, whether it closed cleanly
    blocks/<xy>/<cid text>     one file per block; <xy>: the first two base32 characters of the digest
    blocks/<xy>/.tmp-<n>       a block being written; removed when the store is opened
    pins/<sha256(name)>.pin    one pin set: magic, name, count, binary CIDs, sha-256 of all that

Decisions:

- Writes go to a temp file in the block's own directory, then ``os.replace`` it to its final name,
  so a SIGKILL at any point leaves either the whole block or no block under that name.
- No fsync per block: a SIGKILL cannot lose what was written (the page cache outlives the
  process), and on this project's ext4 VM disk an fsync per 1 MiB block cut put from ~0.8-1 GB/s to
  ~0.3-0.5 GB/s, under the 800 MB/s the content plane needs. Power loss is handled at the edges of
  a session instead: ``close()`` syncs before it marks the session clean in STATE; reopening after
  an unclean session on the same boot syncs once (the page cache survived); reopening after an
  unclean session on a machine that has rebooted since (another boot id) re-hashes the blocks
  whose mtime is later than that session's start (written or used by it) and drops the bad ones.
  Every other open trusts the files without hashing them.
- Recency lives in the files' mtimes, set by the store itself (a strictly increasing nanosecond
  stamp, written on put and on every get or path lookup): it costs one ``futimens`` per use, needs
  no index file that a crash could leave stale, and the scan that finds the blocks at open reads it
  for free. Blocks held when a pin set drops them count as just used.
- Pin sets are written durably (temp file, fsync, replace, fsync of the directory), one small file
  per set so changing one set never rewrites the others; they may name blocks not (yet) held.
- A crash between storing a block and recording its pin leaves an ordinary unpinned block, which
  may be collected later; the pin was never acknowledged (``pin()`` had not returned). So a
  publisher pins the whole DAG before it stores (or announces) its blocks: ``pin()`` accepts CIDs
  not held yet, and every crash then leaves either no pin or a pin whose missing blocks
  ``missing(name)`` lists, to store again. After a power loss the same holds: a pin record is
  durable when ``pin()`` returns, and blocks found corrupt at the next open are dropped (listed
  by ``missing``).

Sizes and capacity count block bytes (not the file system's allocation). Every method is
thread-safe: one lock guards the index; hashing, reading and writing block bytes happen outside it.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Self

from lattica.content._cid import Cid
from lattica.content._dagpb import MAX_BLOCK
from lattica.errors import BadBlock, BlockNotFound, ContentError, InvalidCid, StoreFull
from lattica.logging import get_logger

__all__ = [
    "Blockstore",
    "DiskBlockstore",
    "MemoryBlockstore",
    "BlockstoreStats",
    "Collected",
    "MAX_BLOCK_SIZE",
    "DEFAULT_CAPACITY",
]

log = get_logger("lattica.content")

MAX_BLOCK_SIZE: Final = MAX_BLOCK  # the largest block of the content plane (lattica.content._dagpb)
DEFAULT_CAPACITY: Final = 16 * 1024**3
_MAX_PIN_NAME: Final = 1024  # bytes of UTF-8
_TMP: Final = ".tmp-"
_PIN_MAGIC: Final = b"LATTICA-PINSET\x01"
_FULL_ERRNOS: Final = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG) if e is not None)


@dataclass(frozen=True)
class BlockstoreStats:
    """A snapshot of a blockstore's contents; ``bytes`` and ``pinned_bytes`` count held blocks."""

    blocks: int
    bytes: int
    capacity: int
    pinned_blocks: int
    pinned_bytes: int
    pin_sets: int


@dataclass(frozen=True)
class Collected:
    """What a collection removed: the blocks' CIDs, least recently used first, and their bytes."""

    cids: tuple[Cid, ...]
    bytes: int

    @property
    def blocks(self) -> int:
        return len(self.cids)


class Blockstore:
    """What every blockstore does; subclasses only move bytes (see ``DiskBlockstore``)."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise ContentError(f"a blockstore capacity is a number of bytes >= 0, not {capacity!r}")
        self._lock = threading.Lock()
        self._capacity = capacity
        self._lru: OrderedDict[Cid, int] = OrderedDict()  # unpinned held blocks -> size, oldest first
        self._pinned: dict[Cid, int] = {}  # held blocks some pin set names -> size
        self._bytes = 0
        self._pinned_bytes = 0
        self._reserved = 0  # bytes of puts being written outside the lock
        self._sets: dict[str, frozenset[Cid]] = {}
        self._pin_count: dict[Cid, int] = {}  # how many sets name each CID (held or not)
        self._last_stamp = 0
        self._closed = False
        self._where = "the blockstore"

    # -- blocks ----------------------------------------------------------------------------------

    def put(self, cid: Cid | str, data: bytes | bytearray | memoryview, *, verified: bool = False) -> bool:
        """Store ``data`` as the block ``cid`` names, collecting least recently used unpinned blocks
        if it does not fit. True if it was added, False if it was already held (then only its
        recency changes). BadBlock if the data does not match the CID or is larger than
        MAX_BLOCK_SIZE; StoreFull if there is no room even after collection, or the disk is full.
        ``verified``: the caller just hashed the data itself (the importer, a fetch's check)."""
        cid = Cid.parse(cid)
        size = memoryview(data).nbytes
        if size > MAX_BLOCK_SIZE:
            raise BadBlock(f"block {cid} has {size} bytes, more than the {MAX_BLOCK_SIZE} a block may have")
        if not verified and not cid.verify(data):
            raise BadBlock(f"the data given for block {cid} does not hash to it")
        with self._lock:
            self._check_open()
            stamp = self._stamp()
            if self._used(cid, stamp):
                return False
            self._make_room(size, cid)
            self._reserved += size
        try:
            token = self._write_temp(cid, data, stamp)
        except OSError as e:
            with self._lock:
                self._reserved -= size
            raise self._write_error(e, cid, size) from None
        except BaseException:
            with self._lock:
                self._reserved -= size
            raise
        with self._lock:
            self._reserved -= size
            if self._closed or cid in self._lru or cid in self._pinned:  # closed, or a racing put won
                self._abort_temp(token)
                self._check_open()
                return False
            try:
                self._commit(cid, token)
            except OSError as e:
                self._abort_temp(token)
                raise self._write_error(e, cid, size) from None
            self._add(cid, size)
        return True

    def get(self, cid: Cid | str, *, verify: bool = False) -> bytes:
        """The bytes of block ``cid`` (it becomes the most recently used); BlockNotFound if it is not
        held. ``verify`` re-hashes them: a block that no longer matches is dropped (BlockNotFound)."""
        cid = Cid.parse(cid)
        with self._lock:
            self._check_open()
            size = self._size(cid)
            stamp = self._stamp()
            self._bump(cid)
        try:
            data = self._read(cid, size, stamp)
        except OSError as e:
            raise ContentError(f"cannot read block {cid}: {e.strerror or e}") from None
        if data is None:
            with self._lock:
                if (cid in self._lru or cid in self._pinned) and not self._exists(cid):
                    self._forget(cid)
            raise BlockNotFound(f"block {cid} is not in the blockstore (it was removed meanwhile)")
        if len(data) != size or (verify and not cid.verify(data)):
            with self._lock:
                if cid in self._lru or cid in self._pinned:
                    self._forget(cid)
                    self._remove(cid)
            log.warning("corrupt block dropped", cid=str(cid), size=len(data), expected=size)
            raise BlockNotFound(f"block {cid} was corrupt in the blockstore and has been dropped")
        return data

    def has(self, cid: Cid | str) -> bool:
        """Whether block ``cid`` is held (its recency does not change)."""
        cid = Cid.parse(cid)
        with self._lock:
            return cid in self._lru or cid in self._pinned

    __contains__ = has

    def size_of(self, cid: Cid | str) -> int:
        """The size in bytes of block ``cid``; BlockNotFound if it is not held."""
        cid = Cid.parse(cid)
        with self._lock:
            return self._size(cid)

    def delete(self, cid: Cid | str) -> bool:
        """Remove block ``cid``; False if it was not held. A pinned block is refused (ContentError):
        unpin the sets that name it first."""
        cid = Cid.parse(cid)
        with self._lock:
            self._check_open()
            if cid in self._pinned:
                names = sorted(n for n, s in self._sets.items() if cid in s)
                raise ContentError(f"block {cid} is pinned by {', '.join(map(repr, names))}: unpin it first")
            if cid not in self._lru:
                return False
            self._forget(cid)
            self._remove(cid)
            return True

    def path_of(self, cid: Cid | str) -> str | None:
        """The file holding block ``cid`` (to memory-map it; it counts as a use), or None if this
        store keeps no files. BlockNotFound if it is not held. The file may be collected later: an
        existing mapping stays valid, a later open of the path may fail."""
        cid = Cid.parse(cid)
        with self._lock:
            self._check_open()
            self._size(cid)
            stamp = self._stamp()
            self._used(cid, stamp)
            return self._path(cid)

    def __iter__(self) -> Iterator[Cid]:
        """The CIDs held when iteration starts, least recently used (unpinned) first, pinned last."""
        with self._lock:
            return iter([*self._lru, *self._pinned])

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru) + len(self._pinned)

    @property
    def capacity(self) -> int:
        return self._capacity

    def stats(self) -> BlockstoreStats:
        with self._lock:
            return BlockstoreStats(
                blocks=len(self._lru) + len(self._pinned),
                bytes=self._bytes,
                capacity=self._capacity,
                pinned_blocks=len(self._pinned),
                pinned_bytes=self._pinned_bytes,
                pin_sets=len(self._sets),
            )

    def gc(self, target_bytes: int | None = None) -> Collected:
        """Collect unpinned blocks, least recently used first, until the store holds at most
        ``target_bytes`` (every unpinned block if None); returns what was collected."""
        with self._lock:
            self._check_open()
            return self._collect(None if target_bytes is None else self._bytes - target_bytes)

    # -- pins ------------------------------------------------------------------------------------

    def pin(self, name: str, cids: Iterable[Cid | str]) -> None:
        """Make ``cids`` the pin set ``name`` (replacing a set of that name): while any set names a
        block it is never collected. The CIDs need not be held; the set is durable on return."""
        _check_pin_name(name)
        new = frozenset(Cid.parse(c) for c in cids)
        with self._lock:
            self._check_open()
            try:
                self._save_pin(name, new)
            except OSError as e:
                raise self._write_error(e, None, 0, f"pin set {name!r}") from None
            old = self._sets.get(name, frozenset())
            self._sets[name] = new
            for cid in new - old:
                self._add_pin(cid)
            for cid in old - new:
                self._drop_pin(cid)

    def unpin(self, name: str) -> bool:
        """Drop the pin set ``name``; its blocks no other set names become collectable (as just
        used). False if there was no such set."""
        with self._lock:
            self._check_open()
            old = self._sets.get(name)
            if old is None:
                return False
            try:
                self._delete_pin(name)
            except OSError as e:
                raise ContentError(f"cannot remove pin set {name!r}: {e.strerror or e}") from None
            del self._sets[name]
            for cid in old:
                self._drop_pin(cid)
            return True

    def pins(self) -> dict[str, frozenset[Cid]]:
        """Every pin set by name."""
        with self._lock:
            return dict(self._sets)

    def is_pinned(self, cid: Cid | str) -> bool:
        """Whether any pin set names ``cid`` (held or not)."""
        cid = Cid.parse(cid)
        with self._lock:
            return cid in self._pin_count

    def missing(self, name: str) -> frozenset[Cid]:
        """The CIDs pin set ``name`` names that are not held; ContentError if there is no such set."""
        with self._lock:
            cids = self._sets.get(name)
            if cids is None:
                raise ContentError(f"no pin set named {name!r}")
            return frozenset(c for c in cids if c not in self._pinned)

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop using the store (later calls raise ContentError); idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the index (called with the lock held) ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ContentError("the blockstore is closed")

    def _stamp(self) -> int:
        """A wall-clock nanosecond stamp greater than every one before (the recency order)."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    def _size(self, cid: Cid) -> int:
        size = self._lru.get(cid)
        if size is None:
            size = self._pinned.get(cid)
            if size is None:
                raise BlockNotFound(f"block {cid} is not in the blockstore")
        return size

    def _bump(self, cid: Cid) -> None:
        if cid in self._lru:
            self._lru.move_to_end(cid)

    def _used(self, cid: Cid, stamp: int) -> bool:
        """Mark a held block as just used (here and on disk); False if it is not held."""
        if cid not in self._lru and cid not in self._pinned:
            return False
        self._bump(cid)
        self._touch(cid, stamp)
        return True

    def _add(self, cid: Cid, size: int) -> None:
        if cid in self._pin_count:
            self._pinned[cid] = size
            self._pinned_bytes += size
        else:
            self._lru[cid] = size
        self._bytes += size

    def _forget(self, cid: Cid) -> int:
        size = self._lru.pop(cid, None)
        if size is None:
            size = self._pinned.pop(cid)
            self._pinned_bytes -= size
        self._bytes -= size
        return size

    def _make_room(self, size: int, cid: Cid) -> None:
        """Collect enough unpinned blocks for ``size`` more bytes, or StoreFull (collecting nothing)."""
        need = self._bytes + self._reserved + size - self._capacity
        if need <= 0:
            return
        if size > self._capacity:
            raise StoreFull(
                f"block {cid} ({size} bytes) is larger than the blockstore's capacity ({self._capacity} bytes)"
            )
        if self._bytes - self._pinned_bytes < need:
            raise StoreFull(
                f"no room for block {cid} ({size} bytes) in a blockstore of {self._capacity} bytes: "
                f"{self._bytes} held, {self._pinned_bytes} of them pinned, {self._reserved} being written"
            )
        self._collect(need)

    def _collect(self, need: int | None) -> Collected:
        """Remove least recently used unpinned blocks until ``need`` bytes are freed (all if None)."""
        freed = 0
        cids = []
        while self._lru and (need is None or freed < need):
            cid, size = self._lru.popitem(last=False)
            self._bytes -= size
            freed += size
            cids.append(cid)
            self._remove(cid)
        if cids:
            log.debug("blocks collected", blocks=len(cids), bytes=freed)
        return Collected(tuple(cids), freed)

    def _add_pin(self, cid: Cid) -> None:
        count = self._pin_count.get(cid, 0)
        self._pin_count[cid] = count + 1
        if not count and cid in self._lru:
            size = self._lru.pop(cid)
            self._pinned[cid] = size
            self._pinned_bytes += size

    def _drop_pin(self, cid: Cid) -> None:
        count = self._pin_count.pop(cid) - 1
        if count:
            self._pin_count[cid] = count
        elif cid in self._pinned:
            size = self._pinned.pop(cid)
            self._pinned_bytes -= size
            self._lru[cid] = size

    def _write_error(self, e: OSError, cid: Cid | None, size: int, what: str = "") -> ContentError:
        what = what or f"block {cid} ({size} bytes)"
        if e.errno in _FULL_ERRNOS:
            return StoreFull(f"the disk under {self._where} is full: {what} not stored ({e.strerror})")
        return ContentError(f"cannot write {what} in {self._where}: {e.strerror or e}")

    # -- moving bytes: what a subclass provides --------------------------------------------------

    def _write_temp(self, cid: Cid, data: bytes | bytearray | memoryview, stamp: int) -> object:
        """Write ``data`` where a crash leaves nothing under the block's name (without the lock)."""
        raise NotImplementedError

    def _commit(self, cid: Cid, token: object) -> None:
        """Give the written block its name (with the lock)."""
        raise NotImplementedError

    def _abort_temp(self, token: object) -> None:
        raise NotImplementedError

    def _read(self, cid: Cid, size: int, stamp: int) -> bytes | None:
        """The block's bytes, or None if it is gone (without the lock)."""
        raise NotImplementedError

    def _exists(self, cid: Cid) -> bool:
        raise NotImplementedError

    def _remove(self, cid: Cid) -> None:
        raise NotImplementedError

    def _touch(self, cid: Cid, stamp: int) -> None:
        pass

    def _path(self, cid: Cid) -> str | None:
        return None

    def _save_pin(self, name: str, cids: frozenset[Cid]) -> None:
        pass

    def _delete_pin(self, name: str) -> None:
        pass

    def _on_close(self) -> None:
        pass


class MemoryBlockstore(Blockstore):
    """A blockstore in a dict: same rules as the disk one, nothing survives the process."""

    def __init__(self, capacity: int = 256 * 1024 * 1024) -> None:
        super().__init__(capacity)
        self._data: dict[Cid, bytes] = {}

    def _write_temp(self, cid: Cid, data: bytes | bytearray | memoryview, stamp: int) -> object:
        return bytes(data)

    def _commit(self, cid: Cid, token: object) -> None:
        self._data[cid] = token  # type: ignore[assignment]

    def _abort_temp(self, token: object) -> None:
        pass

    def _read(self, cid: Cid, size: int, stamp: int) -> bytes | None:
        return self._data.get(cid)

    def _exists(self, cid: Cid) -> bool:
        return cid in self._data

    def _remove(self, cid: Cid) -> None:
        self._data.pop(cid, None)


class DiskBlockstore(Blockstore):
    """A blockstore in a directory (see the module docstring for its layout and guarantees).

    Opening it scans the block directories once (names and stat, no hashing), removes leftover
    temp files, loads the pin sets and collects down to ``capacity`` if it holds more. Only one
    store may have a directory open at a time (ContentError otherwise)."""

    def __init__(self, path: str | os.PathLike[str], capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity)
        self._root = self._where = os.path.abspath(os.fspath(path))
        self._blocks = os.path.join(self._root, "blocks")
        self._pins_dir = os.path.join(self._root, "pins")
        self._dirs: set[str] = set()
        self._tmp_ids = itertools.count()
        self._wrote = False
        try:
            os.makedirs(self._blocks, exist_ok=True)
            os.makedirs(self._pins_dir, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self._root, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ContentError(f"cannot open the blockstore at {self._root}: {e.strerror or e}") from None
        try:
            _flock(self._lock_fd, self._root)
            self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise

    @property
    def path(self) -> str:
        return self._root

    def __repr__(self) -> str:
        return f"DiskBlockstore({self._root!r}, capacity={self._capacity})"

    # -- opening ---------------------------------------------------------------------------------

    def _open(self) -> None:
        state_path = os.path.join(self._root, "STATE")
        previous = _read_state(state_path)
        boot = _boot_id()
        unclean = previous is not None and not previous.get("clean")
        rebooted = boot is None or previous is None or previous.get("boot_id") != boot
        # the blocks an unclean session wrote may be unsynced: lost with a reboot, or to sync now
        suspect_since = int(previous.get("opened_ns", 0)) if unclean and rebooted else None  # type: ignore[union-attr]
        if unclean and not rebooted:
            os.sync()
        found = self._scan(suspect_since)
        found.sort()
        for _mtime, cid, size in found:
            self._lru[cid] = size
            self._bytes += size
        self._last_stamp = found[-1][0] if found else 0
        self._load_pins()
        try:
            _write_durably(
                state_path,
                json.dumps({"format": 1, "boot_id": boot, "opened_ns": self._stamp(), "clean": False}).encode(),
            )
        except OSError as e:
            raise ContentError(f"cannot open the blockstore at {self._root}: {e.strerror or e}") from None
        if self._bytes > self._capacity:
            got = self._collect(self._bytes - self._capacity)
            log.info("blockstore over capacity at open", collected=got.blocks, bytes=got.bytes)

    def _scan(self, suspect_since: int | None) -> list[tuple[int, Cid, int]]:
        found: list[tuple[int, Cid, int]] = []
        temps = dropped = 0
        with os.scandir(self._blocks) as top:
            subdirs = [e.path for e in top if e.is_dir(follow_symlinks=False)]
        for sub in subdirs:
            self._dirs.add(sub)
            prefix = os.path.basename(sub)
            with os.scandir(sub) as entries:
                for entry in entries:
                    if entry.name.startswith(_TMP):
                        _unlink(entry.path)
                        temps += 1
                        continue
                    try:
                        cid = Cid.parse(entry.name)
                    except InvalidCid:
                        log.warning("foreign file in the blockstore left alone", path=entry.path)
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if _fanout(cid) != prefix or not entry.is_file(follow_symlinks=False):
                        log.warning("misplaced file in the blockstore left alone", path=entry.path)
                        continue
                    size = st.st_size
                    suspect = suspect_since is not None and st.st_mtime_ns >= suspect_since
                    if size > MAX_BLOCK_SIZE or ((suspect or not size) and not _file_matches(entry.path, cid)):
                        _unlink(entry.path)
                        dropped += 1
                        continue
                    found.append((st.st_mtime_ns, cid, size))
        if temps or dropped:
            log.info(
                "blockstore opened after a crash",
                root=self._root,
                temp_files_removed=temps,
                corrupt_blocks_dropped=dropped,
            )
        return found

    def _load_pins(self) -> None:
        with os.scandir(self._pins_dir) as entries:
            names = [e.name for e in entries]
        for fname in names:
            path = os.path.join(self._pins_dir, fname)
            if fname.startswith(_TMP):
                _unlink(path)
                continue
            if not fname.endswith(".pin"):
                continue
            try:
                with open(path, "rb") as f:
                    name, cids = _parse_pin_file(f.read())
            except (OSError, ValueError, InvalidCid) as e:
                log.error("unreadable pin set file set aside", path=path, error=str(e))
                try:
                    os.replace(path, path + ".corrupt")
                except OSError:
                    pass
                continue
            self._sets[name] = cids
            for cid in cids:
                self._add_pin(cid)

    def _on_close(self) -> None:
        try:
            if self._wrote:
                os.sync()  # blocks are not fsynced one by one; the clean mark must not outrun them
            _write_durably(
                os.path.join(self._root, "STATE"),
                json.dumps({"format": 1, "boot_id": _boot_id(), "clean": True}).encode(),
            )
        except OSError as e:
            log.warning("blockstore not marked clean", root=self._root, error=str(e))
        finally:
            os.close(self._lock_fd)

    # -- moving bytes ----------------------------------------------------------------------------

    def _path(self, cid: Cid) -> str:
        return os.path.join(self._blocks, _fanout(cid), str(cid))

    def _write_temp(self, cid: Cid, data: bytes | bytearray | memoryview, stamp: int) -> object:
        folder = os.path.join(self._blocks, _fanout(cid))
        if folder not in self._dirs:
            try:
                os.mkdir(folder)  # (its parent exists since open: makedirs would stat every level first)
            except FileExistsError:
                pass
            self._dirs.add(folder)
        tmp = os.path.join(folder, f"{_TMP}{os.getpid()}-{next(self._tmp_ids)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                os.utime(fd, ns=(stamp, stamp))
            finally:
                os.close(fd)
        except BaseException:
            _unlink(tmp)
            raise
        return tmp

    def _commit(self, cid: Cid, token: object) -> None:
        os.replace(token, self._path(cid))  # type: ignore[arg-type]
        self._wrote = True

    def _abort_temp(self, token: object) -> None:
        _unlink(token)  # type: ignore[arg-type]

    def _read(self, cid: Cid, size: int, stamp: int) -> bytes | None:
        try:
            fd = os.open(self._path(cid), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            parts = []
            got = 0
            while got <= size:
                chunk = os.read(fd, size + 1 - got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
            try:
                os.utime(fd, ns=(stamp, stamp))
            except OSError:
                pass  # a read-only file system: recency is best effort
        finally:
            os.close(fd)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _exists(self, cid: Cid) -> bool:
        return os.path.exists(self._path(cid))

    def _remove(self, cid: Cid) -> None:
        try:
            os.unlink(self._path(cid))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove a block file", cid=str(cid), error=str(e))

    def _touch(self, cid: Cid, stamp: int) -> None:
        try:
            os.utime(self._path(cid), ns=(stamp, stamp))
        except OSError:
            pass  # recency is best effort

    def _save_pin(self, name: str, cids: frozenset[Cid]) -> None:
        _write_durably(os.path.join(self._pins_dir, _pin_file(name)), _pin_file_bytes(name, cids))

    def _delete_pin(self, name: str) -> None:
        _unlink(os.path.join(self._pins_dir, _pin_file(name)))
        _fsync_dir(self._pins_dir)


# -- helpers -------------------------------------------------------------------------------------


def _fanout(cid: Cid) -> str:
    """The block's directory: two base32 characters of its digest (1024 directories)."""
    d = cid.digest
    n = (d[0] << 2) | (d[1] >> 6)
    return _B32[n >> 5] + _B32[n & 31]


_B32: Final = "abcdefghijklmnopqrstuvwxyz234567"


def _file_matches(path: str, cid: Cid) -> bool:
    try:
        with open(path, "rb") as f:
            return cid.verify(f.read(MAX_BLOCK_SIZE + 1))
    except OSError:
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _flock(fd: int, root: str) -> None:
    try:
        import fcntl  # POSIX only; elsewhere nothing stops a second store on the same directory
    except ImportError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ContentError(
            f"the blockstore at {root} is already open (in this process or another one); "
            "give each node its own blockstore directory"
        ) from None


def _boot_id() -> str | None:
    """This boot of the machine (Linux); None where it cannot be known."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _read_state(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treat the last session as unclean
    return state if isinstance(state, dict) else {}


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def _write_durably(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename, fsync dir)."""
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f"{_TMP}{os.getpid()}-{threading.get_ident()}-{os.path.basename(path)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(folder)


def _check_pin_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ContentError(f"a pin set name is a non-empty string, not {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ContentError(f"a pin set name must be valid Unicode text: {name!r}") from None
    if size > _MAX_PIN_NAME:
        raise ContentError(f"a pin set name has at most {_MAX_PIN_NAME} bytes of UTF-8, not {size}")


def _pin_file(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:40] + ".pin"


def _pin_file_bytes(name: str, cids: frozenset[Cid]) -> bytes:
    raw = name.encode("utf-8")
    body = b"".join([_PIN_MAGIC, struct.pack(">HI", len(raw), len(cids)), raw, *sorted(c.bytes for c in cids)])
    return body + hashlib.sha256(body).digest()


def _parse_pin_file(data: bytes) -> tuple[str, frozenset[Cid]]:
    head = len(_PIN_MAGIC) + 6
    if len(data) < head + 32 or not data.startswith(_PIN_MAGIC):
        raise ValueError("not a pin set file")
    body = data[:-32]
    if hashlib.sha256(body).digest() != data[-32:]:
        raise ValueError("pin set file fails its checksum")
    name_len, count = struct.unpack_from(">HI", body, len(_PIN_MAGIC))
    pos = head + name_len
    name = body[head:pos].decode("utf-8")
    cids = []
    while pos < len(body):
        cid, pos = Cid.read(body, pos)
        cids.append(cid)
    if len(cids) != count or pos != len(body):
        raise ValueError(f"pin set file holds {len(cids)} CIDs, its header says {count}")
    return name, frozenset(cids)
