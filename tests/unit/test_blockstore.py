"""The blockstore, on disk and in memory: blocks verified on put and capped by size, LRU collection
that never touches a pinned block, StoreFull when nothing can go, pin sets, and (on disk) blocks,
pins and recency that survive a restart, temp files swept on open, suspect blocks re-hashed only
after a reboot that followed an unclean session."""

from __future__ import annotations

import os
import threading

import pytest

from lattica.content import _blockstore as bs
from lattica.content._blockstore import MAX_BLOCK_SIZE, DiskBlockstore, MemoryBlockstore
from lattica.content._cid import DAG_PB, Cid
from lattica.errors import BadBlock, BlockNotFound, ContentError, StoreFull


def block(i: int, size: int = 300) -> tuple[Cid, bytes]:
    data = (i.to_bytes(4, "big") * (size // 4 + 1))[:size]
    return Cid.of(data), data


A, B, C, D, E = (block(i) for i in range(1, 6))


@pytest.fixture(params=["memory", "disk"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def open_store(kind, tmp_path):
    """``open_store(capacity)``: a store of the parametrized kind; for disk, the same directory on
    every call (close the previous one first to reopen it)."""
    opened = []

    def open_(capacity: int = 1000):
        s = MemoryBlockstore(capacity) if kind == "memory" else DiskBlockstore(tmp_path / "store", capacity)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def block_files(root) -> list[str]:
    return files_under(os.path.join(root, "blocks"))


def crash(s: DiskBlockstore) -> None:
    """Leave ``s`` the way a killed process would: no clean close, the directory lock released."""
    s._closed = True
    os.close(s._lock_fd)


# -- both stores -------------------------------------------------------------------------------


def test_put_get_has_size_delete(open_store):
    s = open_store()
    (a, da), (b, db) = A, B
    assert s.put(a, da) is True
    assert s.put(a, da) is False  # idempotent
    assert s.put(str(b), bytearray(db)) is True  # CID text and any bytes-like
    assert s.get(a) == da and s.get(str(b)) == db
    assert s.has(a) and a in s and not s.has(C[0])
    assert s.size_of(a) == 300
    assert len(s) == 2 and set(s) == {a, b}
    assert s.delete(a) is True
    assert not s.has(a) and s.delete(a) is False
    with pytest.raises(BlockNotFound, match=str(a)):
        s.get(a)
    with pytest.raises(BlockNotFound):
        s.size_of(a)
    assert s.stats().blocks == 1 and s.stats().bytes == 300


def test_dag_pb_and_empty_blocks(open_store):
    s = open_store()
    node = b"\x0a\x02\x08\x01"
    s.put(Cid.of(node, DAG_PB), node)
    s.put(Cid.of(b""), b"")
    assert s.get(Cid.of(node, DAG_PB)) == node
    assert s.get(Cid.of(b"")) == b""
    assert not s.has(Cid.of(node))  # same bytes, other codec: another CID


def test_put_refuses_data_that_does_not_match_its_cid(open_store):
    s = open_store()
    with pytest.raises(BadBlock, match="does not hash"):
        s.put(A[0], B[1])
    with pytest.raises(BadBlock):
        s.put(A[0], A[1] + b"x")
    assert not s.has(A[0]) and s.stats().bytes == 0 and len(s) == 0


def test_oversize_block_refused_and_max_size_accepted(open_store):
    s = open_store(capacity=3 * MAX_BLOCK_SIZE)
    big = os.urandom(MAX_BLOCK_SIZE + 1)
    with pytest.raises(BadBlock, match="more than"):
        s.put(Cid.of(big), big)
    ok = big[:MAX_BLOCK_SIZE]
    assert s.put(Cid.of(ok), ok)
    assert s.get(Cid.of(ok)) == ok
    assert s.stats().bytes == MAX_BLOCK_SIZE


def test_lru_collects_least_recently_used_first(open_store):
    s = open_store(capacity=1000)  # room for three 300-byte blocks
    for cid, data in (A, B, C):
        s.put(cid, data)
    s.get(A[0])  # A is now the most recently used; B the least
    s.has(B[0])  # has() is not a use
    s.put(*D)
    assert set(s) == {A[0], C[0], D[0]}
    s.put(A[0], A[1])  # putting a held block again is a use
    s.put(*E)
    assert set(s) == {A[0], D[0], E[0]}
    assert s.stats().bytes == 900


def test_pinned_blocks_are_never_collected(open_store):
    s = open_store(capacity=1000)
    for cid, data in (A, B, C):
        s.put(cid, data)
    s.pin("mine", [A[0], E[0]])  # E is not held yet: pinned when it arrives
    s.put(*D)  # A is least recently used but pinned: B goes
    assert set(s) == {A[0], C[0], D[0]}
    s.put(*E)
    assert set(s) == {A[0], D[0], E[0]}
    st = s.stats()
    assert (st.pinned_blocks, st.pinned_bytes, st.pin_sets) == (2, 600, 1)
    assert s.gc().cids == (D[0],)
    assert set(s) == {A[0], E[0]}


def test_store_full_when_everything_is_pinned(open_store, kind, tmp_path):
    s = open_store(capacity=1000)
    for cid, data in (A, B, C):
        s.put(cid, data)
    s.pin("all", [A[0], B[0], C[0]])
    with pytest.raises(StoreFull, match="pinned") as err:
        s.put(*D)
    assert isinstance(err.value, ContentError) and isinstance(err.value, OSError)
    assert set(s) == {A[0], B[0], C[0]} and not s.has(D[0])
    if kind == "disk":
        assert len(block_files(tmp_path / "store")) == 3  # nothing half-written
    s.pin("all", [A[0], B[0]])  # C becomes collectable
    s.put(*D)
    assert set(s) == {A[0], B[0], D[0]}


def test_store_full_refuses_without_collecting_when_collection_would_not_be_enough(open_store):
    s = open_store(capacity=700)
    s.put(*A)
    s.put(*B)
    s.pin("a", [A[0]])
    big_cid, big = block(9, 500)  # needs 400 more bytes, only B's 300 are collectable
    with pytest.raises(StoreFull):
        s.put(big_cid, big)
    assert set(s) == {A[0], B[0]}  # B was not collected for nothing
    huge_cid, huge = block(10, 701)
    with pytest.raises(StoreFull, match="larger than the blockstore's capacity"):
        s.put(huge_cid, huge)


def test_gc_returns_what_it_freed(open_store):
    s = open_store(capacity=10_000)
    for cid, data in (A, B, C, D):
        s.put(cid, data)
    s.pin("c", [C[0]])
    got = s.gc(target_bytes=700)
    assert got.cids == (A[0], B[0]) and got.bytes == 600 and got.blocks == 2
    assert s.gc(target_bytes=700).blocks == 0  # already at most 700 bytes
    got = s.gc()
    assert got.cids == (D[0],) and got.bytes == 300
    assert set(s) == {C[0]}
    st = s.stats()
    assert (st.blocks, st.bytes, st.capacity, st.pinned_blocks, st.pinned_bytes) == (1, 300, 10_000, 1, 300)


def test_pin_sets(open_store):
    s = open_store()
    s.put(*A)
    s.pin("one", [A[0], str(B[0])])
    s.pin("two", [A[0]])
    assert s.pins() == {"one": frozenset({A[0], B[0]}), "two": frozenset({A[0]})}
    assert s.is_pinned(A[0]) and s.is_pinned(str(B[0])) and not s.is_pinned(C[0])
    assert s.missing("one") == {B[0]}
    with pytest.raises(ContentError, match="pinned by 'one', 'two'"):
        s.delete(A[0])
    assert s.unpin("one") is True and s.unpin("one") is False
    assert s.is_pinned(A[0]) and not s.is_pinned(B[0])  # "two" still holds A
    s.pin("two", [C[0]])  # replaces the set
    assert not s.is_pinned(A[0]) and s.pins() == {"two": frozenset({C[0]})}
    assert s.stats().pinned_bytes == 0
    assert s.delete(A[0])
    with pytest.raises(ContentError):
        s.missing("one")
    with pytest.raises(ContentError):
        s.pin("", [A[0]])


def test_path_of(open_store, kind):
    s = open_store()
    s.put(*A)
    path = s.path_of(A[0])
    if kind == "memory":
        assert path is None
    else:
        with open(path, "rb") as f:
            assert f.read() == A[1]
    with pytest.raises(BlockNotFound):
        s.path_of(B[0])


def test_closed_store_refuses_calls(open_store):
    s = open_store()
    s.put(*A)
    s.close()
    s.close()
    with pytest.raises(ContentError, match="closed"):
        s.get(A[0])
    with pytest.raises(ContentError, match="closed"):
        s.put(*B)


def test_bad_capacity(kind, tmp_path):
    with pytest.raises(ContentError, match="capacity"):
        MemoryBlockstore(-1) if kind == "memory" else DiskBlockstore(tmp_path, -1)


def test_threads_keep_the_index_and_the_contents_consistent(open_store, kind, tmp_path):
    s = open_store(capacity=20 * 1000)
    blocks = [block(i, 1000) for i in range(60)]
    s.pin("keep", [cid for cid, _ in blocks[:5]])
    errors = []

    def work(k: int) -> None:
        try:
            for n in range(300):
                cid, data = blocks[(n * 7 + k * 13) % len(blocks)]
                s.put(cid, data)
                try:
                    assert s.get(cid) == data
                except BlockNotFound:
                    pass  # collected by another thread meanwhile
                if n % 5 == k % 5 and not s.is_pinned(cid):
                    s.delete(cid)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    held = set(s)
    st = s.stats()
    assert st.bytes == 1000 * len(held) <= 20 * 1000
    assert st.pinned_bytes == 1000 * len(held & {cid for cid, _ in blocks[:5]})
    for cid in held:
        assert cid.verify(s.get(cid))
    if kind == "disk":
        assert sorted(os.path.basename(f) for f in block_files(tmp_path / "store")) == sorted(map(str, held))


# -- on disk -----------------------------------------------------------------------------------


def test_restart_keeps_blocks_pins_and_recency(tmp_path):
    root = tmp_path / "store"
    with DiskBlockstore(root, capacity=1000) as s:
        for cid, data in (A, B, C):
            s.put(cid, data)
        s.get(A[0])  # order, oldest first: B, C, A
        s.pin("c", [C[0], E[0]])
    with DiskBlockstore(root, capacity=1000) as s:
        assert set(s) == {A[0], B[0], C[0]}
        assert s.get(B[0]) == B[1]  # order now: C, A, B (C pinned)
        assert s.pins() == {"c": frozenset({C[0], E[0]})}
        assert s.missing("c") == {E[0]}
        s.put(*D)
        assert set(s) == {B[0], C[0], D[0]}  # A was the least recently used unpinned block
        s.unpin("c")
    with DiskBlockstore(root, capacity=1000) as s:
        assert s.pins() == {} and not s.is_pinned(C[0])
        assert s.stats().bytes == 900


def test_reopening_with_a_smaller_capacity_collects(tmp_path):
    root = tmp_path / "store"
    with DiskBlockstore(root, capacity=1000) as s:
        for cid, data in (A, B, C):
            s.put(cid, data)
        s.pin("a", [A[0]])
    with DiskBlockstore(root, capacity=600) as s:
        assert set(s) == {A[0], C[0]}
        assert len(block_files(root)) == 2


def test_layout_fans_out_by_digest(tmp_path):
    with DiskBlockstore(tmp_path, capacity=100_000) as s:
        cids = [block(i)[0] for i in range(50)]
        for i in range(50):
            s.put(*block(i))
        paths = block_files(tmp_path)
    import base64  # only to recompute the fan-out independently

    expected = sorted(os.path.join(base64.b32encode(c.digest).decode().lower()[:2], str(c)) for c in cids)
    assert paths == expected
    assert len({os.path.dirname(p) for p in paths}) > 20


def test_stray_temp_files_are_removed_on_open(tmp_path):
    root = tmp_path / "store"
    with DiskBlockstore(root) as s:
        s.put(*A)
        s.pin("a", [A[0]])
        folder = os.path.dirname(s.path_of(A[0]))
    for path in (os.path.join(folder, ".tmp-123-0"), os.path.join(root, "pins", ".tmp-9-x.pin")):
        with open(path, "wb") as f:
            f.write(A[1][:10])  # a torn write
    with DiskBlockstore(root) as s:
        assert set(s) == {A[0]} and s.pins() == {"a": frozenset({A[0]})}
        assert not [f for f in files_under(root) if ".tmp-" in f]


def test_second_open_of_a_directory_is_refused(tmp_path):
    s = DiskBlockstore(tmp_path)
    with pytest.raises(ContentError, match="already open"):
        DiskBlockstore(tmp_path)
    s.close()
    DiskBlockstore(tmp_path).close()


def test_get_drops_a_block_corrupted_on_disk(tmp_path):
    with DiskBlockstore(tmp_path) as s:
        s.put(*A)
        s.put(*B)
        with open(s.path_of(A[0]), "r+b") as f:
            f.write(b"\0" * 10)  # same length, other bytes
        assert s.get(A[0]) != A[1]  # not re-hashed unless asked
        with pytest.raises(BlockNotFound, match="corrupt"):
            s.get(A[0], verify=True)
        with open(s.path_of(B[0]), "ab") as f:
            f.write(b"more")  # another length than the index says: noticed without hashing
        with pytest.raises(BlockNotFound, match="corrupt"):
            s.get(B[0])
        assert len(s) == 0 and block_files(tmp_path) == []


def corrupt_keeping_mtime(root, cid: Cid) -> None:
    """Overwrite the start of a block file the way a lost page would, its mtime unchanged."""
    path = os.path.join(root, "blocks", bs._fanout(cid), str(cid))
    before = os.stat(path).st_mtime_ns
    with open(path, "r+b") as f:
        f.write(b"\0" * 10)
    os.utime(path, ns=(before, before))


def test_recent_blocks_rehashed_only_after_a_reboot_that_followed_an_unclean_session(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with DiskBlockstore(root) as s:
        s.put(*A)  # written and synced by a clean session: trusted from now on
    s = DiskBlockstore(root)
    s.put(*B)
    s.put(*C)
    corrupt_keeping_mtime(root, A[0])
    corrupt_keeping_mtime(root, B[0])
    crash(s)
    monkeypatch.setattr(bs, "_boot_id", lambda: "another-boot")
    s = DiskBlockstore(root)
    assert set(s) == {A[0], C[0]}  # B was written by the unclean session and is bad; A is older
    s.put(*D)
    corrupt_keeping_mtime(root, D[0])
    crash(s)
    s = DiskBlockstore(root)  # same boot: the page cache survived; synced now, nothing re-hashed
    assert set(s) == {A[0], C[0], D[0]}
    crash(s)
    monkeypatch.setattr(bs, "_boot_id", lambda: "third-boot")
    with DiskBlockstore(root) as s:  # the last session synced what it found and wrote nothing
        assert set(s) == {A[0], C[0], D[0]}


def test_unreadable_pin_file_is_set_aside(tmp_path):
    root = tmp_path / "store"
    with DiskBlockstore(root) as s:
        s.pin("good", [A[0]])
        s.pin("bad", [B[0]])
    bad = os.path.join(root, "pins", bs._pin_file("bad"))
    with open(bad, "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    with DiskBlockstore(root) as s:
        assert s.pins() == {"good": frozenset({A[0]})}
    assert os.path.exists(bad + ".corrupt")
