"""Where a node keeps its documents: one SQLite database in WAL mode, written by one thread.

Each document's applied envelopes are appended in the order they were applied (so reading them
back in order replays the document, and serves peers in an order they can apply); a snapshot
holds the document's encoded state and the replica's book-keeping at a position of the log, so
reopening applies only what came after it. A checkpoint the replica took replaces the envelopes
it covers (they are deleted in the same transaction that records it). SQLite's WAL gives the crash safety: a transaction is
all there after a crash or not at all (a torn tail of the WAL is discarded when the database is
opened), and with ``fsync`` a commit returns only once it is on disk. The loop never waits on the
disk: every statement runs on the store's thread, and callers get futures.
"""

from __future__ import annotations

import concurrent.futures
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from lattica.crdt._envelope import Envelope
from lattica.errors import CrdtError

__all__ = ["Store", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB);
CREATE TABLE IF NOT EXISTS docs(doc BLOB PRIMARY KEY, name TEXT NOT NULL, owner BLOB, nonce BLOB, clean INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS envelopes(
    pos INTEGER PRIMARY KEY AUTOINCREMENT, doc BLOB NOT NULL, author BLOB NOT NULL, nonce BLOB NOT NULL,
    seq INTEGER NOT NULL, raw BLOB NOT NULL, UNIQUE(doc, author, nonce, seq));
CREATE INDEX IF NOT EXISTS envelopes_doc ON envelopes(doc, pos);
CREATE TABLE IF NOT EXISTS snapshots(doc BLOB PRIMARY KEY, pos INTEGER NOT NULL, state BLOB NOT NULL, meta BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(doc BLOB NOT NULL, digest BLOB NOT NULL, raw BLOB NOT NULL, state BLOB NOT NULL, PRIMARY KEY(doc, digest));
"""


class Store:
    """The documents' log and snapshots in the SQLite file ``path`` (see the module docstring)."""

    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lattica-crdt-store")
        self._db: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._closed = False
        self._lock = threading.Lock()
        try:
            self.run(self._open).result()
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    def _open(self) -> None:
        import fcntl  # (only where a store opens: start-up time)

        where = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(where, exist_ok=True)
        self._lock_fd = os.open(os.path.join(where, "LOCK"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise CrdtError(f"the CRDT store {where} is in use by another node") from None
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
            db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise CrdtError(f"{self.path} holds CRDT store schema {row[0]}; this version reads {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            db.close()
            os.close(self._lock_fd)
            raise CrdtError(f"cannot open the CRDT store {self.path}: {exc}") from None
        self._db = db

    def run(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the store's thread."""
        with self._lock:
            if self._closed:
                fut: concurrent.futures.Future = concurrent.futures.Future()
                fut.set_exception(CrdtError("the CRDT store is closed"))
                return fut
            return self._submit(fn)

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        try:
            return self._pool.submit(fn)
        except RuntimeError:
            # the interpreter is exiting: its executors take no more work (threading's exit runs
            # before the atexit hook that stops the node) and the store's thread has finished its
            # queue; the last writes and the snapshot run here, in order, rather than be lost
            fut: concurrent.futures.Future = concurrent.futures.Future()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 -- the caller's future carries it
                fut.set_exception(e)
            return fut

    # -- on the store's thread (through ``run``) -------------------------------------------------

    def _doc_row(self, doc: bytes) -> tuple | None:
        assert self._db is not None
        return self._db.execute("SELECT name, owner, nonce, clean FROM docs WHERE doc=?", (doc,)).fetchone()

    def load(self, doc: bytes) -> concurrent.futures.Future:
        """``(nonce or None, snapshot or None, [(pos, Envelope)], [(checkpoint, state)])`` of
        ``doc``: our chain's nonce (None unless the document was closed cleanly: after a crash,
        envelopes we signed may have reached peers and not our disk, so our chain must not go on
        from here), the latest snapshot ``(pos, state, meta)``, every envelope in log order and
        the checkpoints taken (raw bytes) with their states."""

        def load() -> tuple:
            assert self._db is not None
            row = self._doc_row(doc)
            snap = self._db.execute("SELECT pos, state, meta FROM snapshots WHERE doc=?", (doc,)).fetchone()
            envs = []
            for pos, raw in self._db.execute("SELECT pos, raw FROM envelopes WHERE doc=? ORDER BY pos", (doc,)):
                envs.append((pos, Envelope.from_bytes(raw)))
            meta = None if snap is None else (snap[0], snap[1], msgpack.unpackb(snap[2], strict_map_key=False))
            cps = [
                (bytes(r[0]), bytes(r[1]))
                for r in self._db.execute("SELECT raw, state FROM checkpoints WHERE doc=?", (doc,))
            ]
            return (row[2] if row and row[3] else None), meta, envs, cps

        return self.run(load)

    def remember(
        self, doc: bytes, name: str, owner: bytes | None, nonce: bytes, clean: bool = False
    ) -> concurrent.futures.Future:
        """Record the document and our chain's nonce in it; ``clean``: closed, nothing of ours
        is anywhere but here (set when the document closes, cleared when it opens)."""

        def put() -> None:
            assert self._db is not None
            self._db.execute(
                "INSERT OR REPLACE INTO docs VALUES (?, ?, ?, ?, ?)", (doc, name, owner, nonce, int(clean))
            )

        return self.run(put)

    def append(self, doc: bytes, envs: list[Envelope]) -> concurrent.futures.Future:
        """Append ``envs`` (in applied order) in one transaction; done once it is durable."""
        rows = [(doc, e.author, e.nonce, e.seq, e.to_bytes()) for e in envs]

        def put() -> None:
            assert self._db is not None
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany(
                    "INSERT OR IGNORE INTO envelopes(doc, author, nonce, seq, raw) VALUES (?, ?, ?, ?, ?)", rows
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return self.run(put)

    def snapshot(self, doc: bytes, state: bytes, meta: Any) -> concurrent.futures.Future:
        """Record ``state`` (the encoded document) and ``meta`` as of the log's current end."""
        blob = msgpack.packb(meta)

        def put() -> None:
            assert self._db is not None
            pos = self._db.execute("SELECT COALESCE(MAX(pos), 0) FROM envelopes WHERE doc=?", (doc,)).fetchone()[0]
            self._db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?)", (doc, pos, state, blob))

        return self.run(put)

    def compact(
        self,
        doc: bytes,
        raw: bytes,
        digest: bytes,
        state: bytes,
        covers: dict,
        dropped: list[bytes],
        snapshot: tuple[bytes, Any],
    ) -> concurrent.futures.Future:
        """In one transaction: record a checkpoint (``raw``, its ``digest`` and ``state``), forget
        the ones it supersedes (``dropped`` digests), delete the envelopes it covers (``covers``:
        seq per chain) and record ``snapshot`` ``(state, meta)`` of the document now."""
        blob = msgpack.packb(snapshot[1])
        cut = [(doc, a, n, seq) for (a, n), seq in covers.items()]

        def put() -> None:
            assert self._db is not None
            db = self._db
            db.execute("BEGIN")
            try:
                db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)", (doc, digest, raw, state))
                db.executemany("DELETE FROM checkpoints WHERE doc=? AND digest=?", [(doc, d) for d in dropped])
                db.executemany("DELETE FROM envelopes WHERE doc=? AND author=? AND nonce=? AND seq<=?", cut)
                pos = db.execute("SELECT COALESCE(MAX(pos), 0) FROM envelopes WHERE doc=?", (doc,)).fetchone()[0]
                db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?)", (doc, pos, snapshot[0], blob))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return self.run(put)

    def documents(self) -> concurrent.futures.Future:
        """``[(doc, name, owner)]`` of every document held."""

        def get() -> list:
            assert self._db is not None
            return [tuple(r) for r in self._db.execute("SELECT doc, name, owner FROM docs")]

        return self.run(get)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # (the lock goes with it)
                self._lock_fd = -1

        self._submit(shut)
        self._pool.shutdown(wait=True)
