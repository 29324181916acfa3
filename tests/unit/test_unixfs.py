"""dag-pb and UnixFS: the IPFS importer's CIDs (shared vectors and cross-checked layouts), round
trips through the streaming importer and the walker, and every malformed block refused."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lattica._protobuf import uvarint
from lattica.content import _dagpb as dagpb
from lattica.content._cid import DAG_PB, RAW, Cid
from lattica.content._unixfs import (
    CHUNK_DEFAULT,
    CHUNK_MAX,
    DIRECTORY,
    FILE,
    RAW_TYPE,
    Importer,
    UnixFSData,
    Walker,
    build,
    children,
    max_depth,
    walk,
)
from lattica.errors import BadBlock, InvalidCid

VECTORS = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "unixfs" / "cids.json"
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def gen(size: int) -> bytes:
    """The shared vectors' generator: sha256(b'lattica-shared' + i as 8 bytes big-endian), i = 0, 1, ..."""
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(b"lattica-shared" + i.to_bytes(8, "big")).digest()
        i += 1
    return bytes(out[:size])


def _cases():
    if not VECTORS.exists():
        return []
    return json.loads(VECTORS.read_text())["cases"]


def read_all(root, blocks) -> bytes:
    store = dict(blocks)
    return b"".join(bytes(piece) for _, piece in walk(root, store.__getitem__))


def fetch(root, store, *, window=8, start=0, end=None, reverse=True):
    """A fetcher: asks for a window, delivers it (newest first), checks the bytes come in order."""
    walker = Walker(root, start=start, end=end)
    out, asked, peak = bytearray(), [], 0
    while not walker.done:
        if walker.ready:  # it stopped on its step budget (a repeated subtree): read on
            for offset, piece in walker.advance():
                assert offset == start + len(out), "bytes come out in file order"
                out += piece
            continue
        wanted = walker.wants(window)
        assert wanted, "a walk that is not done (nor ready) always wants something"
        asked += wanted
        for cid in reversed(wanted) if reverse else wanted:
            for offset, piece in walker.add(cid, store[cid]):
                assert offset == start + len(out), "bytes come out in file order"
                out += piece
            peak = max(peak, walker.held_bytes)
    return bytes(out), asked, peak


# -- the IPFS importer's CIDs ---------------------------------------------------------------------


@pytest.mark.skipif(
    not VECTORS.exists(), reason=f"shared UnixFS vectors not present at {VECTORS} (they live outside the repository)"
)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_shared_vector(case):
    data = b"hello world" if case["name"] == "hello world" else gen(case["size"])
    assert len(data) == case["size"]
    assert hashlib.sha256(data).hexdigest() == case["sha256"], "the generator is the vectors' generator"
    root, blocks = build(data, case["chunk"])
    assert str(root) == case["cid"]
    assert read_all(root, blocks) == data


# Computed with ipfs-unixfs-importer 17.1.1 (cidVersion 1, rawLeaves, fixedSize chunker) for gen(size):
# the layouts the shared vectors do not reach (175 chunks, 174*174 and 174*174+1 chunks).
CROSS_CHECKED = [
    (0, 4, "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"),
    (1, 4, "bafkreiffvn4czac6rp56gtfwk5bkary46wstvf7quelavnwmzo3ezejrzy"),
    (3, 4, "bafkreidzpxondeimx4u4xunu6npcbpgcvy6gjvgpbsiyvqxmele66mepay"),
    (4, 4, "bafkreifghnzxyrgaochwfqrvphtzfpya3rl5onwabz4mcq6ipiot6f2gx4"),
    (5, 4, "bafybeibhghvl4gberbloyw5t3t24on7ftro7fp7uquk4ah7chegz62iwz4"),
    (696, 4, "bafybeid3bvla74zwabwwwdslkz22timyzfalgbsvmunk66z46houfvwhrq"),
    (700, 4, "bafybeidsipuyxwhatidmta4vhsnywcx3ogwj5gh2sspvh3obdlez2sb3ye"),
    (5000, 7, "bafybeic436aykhaziqg4mjo73cbwhfunvjfkputbexcmznjbiv5442iipm"),
    (30276, 1, "bafybeiaiwnh6j7gzppxlktnawp7u2y5duwtfhje6bwu5rmqkwzkspoqwii"),
    (30277, 1, "bafybeigtp6sd4yfadpmjl6jzenfc3nk2vd3eq5pbf34i26e7zroeldjjnm"),
    (121104, 4, "bafybeigey3l5sff5uklmdlsn7ka5gkersqrdta7llkpovpzs6ysrebyzxu"),
    (121105, 4, "bafybeibxtu6lhvivskfmj7bpegkjqhowbt2rtcmc2xczkfasjofm5xhibq"),
]


@pytest.mark.parametrize("size,chunk,cid", CROSS_CHECKED, ids=lambda v: str(v)[:12])
def test_importer_cids_cross_checked(size, chunk, cid):
    assert str(build(gen(size), chunk)[0]) == cid


def test_empty_file_is_the_empty_raw_leaf():
    root, blocks = build(b"")
    assert root == Cid.of(b"", RAW) and str(root) == "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert [(c, bytes(b)) for c, b in blocks] == [(root, b"")]
    assert read_all(root, blocks) == b""


# -- layout ----------------------------------------------------------------------------------


def check_file_node(store, cid, sizes):
    """The node is exactly what the IPFS importer writes for children of these content sizes."""
    block = store[cid]
    node = dagpb.decode(block)
    ufs = UnixFSData.decode(node.data)
    assert ufs == UnixFSData(FILE, filesize=sum(sizes), blocksizes=tuple(sizes))
    assert node.data == b"\x08\x02\x18" + uvarint(sum(sizes)) + b"".join(b"\x20" + uvarint(s) for s in sizes)
    for link in node.links:
        assert link.name == "", "links carry an empty Name"
        child = store[link.cid]
        if link.cid.codec == RAW:
            assert link.tsize == len(child)
        else:
            assert link.tsize == len(child) + sum(x.tsize for x in dagpb.decode(child).links)
    assert dagpb.encode(node.links, node.data) == block, "the importer writes the canonical form"
    return node


@pytest.mark.parametrize("chunks_extra", [(0, 0), (0, 1), (1, -1), (1, 0), (1, 1), (2, -1)])
def test_small_files(chunks_extra):
    chunk = 16
    chunks, extra = chunks_extra
    data = gen(chunks * chunk + extra)
    root, blocks = build(data, chunk)
    store = dict(blocks)
    if len(data) <= chunk:
        assert root == Cid.of(data, RAW) and len(blocks) == 1, "one chunk: the raw leaf is the file"
    else:
        sizes = [chunk] * (len(data) // chunk) + ([len(data) % chunk] if len(data) % chunk else [])
        node = check_file_node(store, root, sizes)
        assert [link.cid for link in node.links] == [
            Cid.of(data[i : i + chunk], RAW) for i in range(0, len(data), chunk)
        ]
    assert read_all(root, blocks) == data


def test_174_chunks_make_one_node_and_175_two_levels():
    chunk = 4
    data = gen(174 * chunk)
    root, blocks = build(data, chunk)
    store = dict(blocks)
    assert len(check_file_node(store, root, [chunk] * 174).links) == 174
    assert read_all(root, blocks) == data

    data = gen(175 * chunk)
    root, blocks = build(data, chunk)
    store = dict(blocks)
    top = check_file_node(store, root, [174 * chunk, chunk])
    first = check_file_node(store, top.links[0].cid, [chunk] * 174)
    assert all(link.cid.codec == RAW for link in first.links)
    last = check_file_node(store, top.links[1].cid, [chunk])
    assert last.links[0].cid == Cid.of(data[-chunk:], RAW), "a last group of one leaf is wrapped in a node"
    assert len(blocks) == 175 + 3
    assert read_all(root, blocks) == data


def test_174_squared_plus_one_chunks_make_three_levels():
    data = gen(174 * 174 + 1)
    root, blocks = build(data, 1)
    store = dict(blocks)
    top = check_file_node(store, root, [174 * 174, 1])
    big = check_file_node(store, top.links[0].cid, [174] * 174)
    for link in big.links:
        check_file_node(store, link.cid, [1] * 174)
    small = check_file_node(store, top.links[1].cid, [1])
    single = check_file_node(store, small.links[0].cid, [1])
    assert single.links[0].cid == Cid.of(data[-1:], RAW), "single entries are wrapped at every level"
    assert len(blocks) == (174 * 174 + 1) + (174 + 1) + (1 + 1) + 1
    assert read_all(root, blocks) == data


def test_exactly_174_squared_chunks_end_at_one_node():
    root, blocks = build(gen(174 * 174), 1)
    store = dict(blocks)
    top = check_file_node(store, root, [174] * 174)
    assert all(link.cid.codec == DAG_PB for link in top.links)


# -- the streaming importer ----------------------------------------------------------------------


def test_feed_in_odd_pieces_gives_the_same_blocks():
    rng = random.Random(7)
    chunk = 64
    data = gen(chunk * 400 + 17)
    root, blocks = build(data, chunk)
    for trial in range(4):
        imp = Importer(chunk)
        got, pos = [], 0
        while pos < len(data):
            n = rng.choice([0, 1, 3, chunk - 1, chunk, chunk + 1, 5 * chunk + 3, rng.randrange(300)])
            piece = data[pos : pos + n]
            piece = [bytes, bytearray, memoryview][trial % 3](piece) if trial < 3 else memoryview(bytearray(piece))
            got += imp.feed(piece)
            pos += n
        r, rest = imp.finish()
        assert r == root and imp.size == len(data)
        assert [(c, bytes(b)) for c, b in got + rest] == [(c, bytes(b)) for c, b in blocks]


def test_blocks_come_out_as_soon_as_complete():
    chunk = 8
    imp = Importer(chunk)
    assert imp.feed(b"x" * (chunk - 1)) == []
    out = imp.feed(b"x")
    assert [c for c, _ in out] == [Cid.of(b"x" * chunk, RAW)], "a full chunk is a leaf at once"
    out = imp.feed(gen(173 * chunk))
    assert len(out) == 173 + 1 and out[-1][0].codec == DAG_PB, "174 leaves make their node at once"
    assert imp.feed(b"y") == []
    root, rest = imp.finish()
    assert [c.codec for c, _ in rest] == [RAW, DAG_PB, DAG_PB] and rest[-1][0] == root


def test_leaves_of_a_bytes_argument_are_not_copied():
    data = gen(3 * 1000)
    root, blocks = build(data, 1000)
    leaves = [b for c, b in blocks if c.codec == RAW]
    assert all(isinstance(b, memoryview) and b.readonly and b.obj is data for b in leaves)
    buf = bytearray(data)
    imp = Importer(1000)
    leaves = imp.feed(buf)
    buf[:] = bytes(len(buf))
    assert bytes(leaves[0][1]) == data[:1000], "a mutable argument is copied"


def test_importer_holds_one_chunk_not_the_file():
    source = memoryview(bytes(range(256)) * (32 * 4096))  # 32 MiB, made before measuring
    imp = Importer(CHUNK_DEFAULT)
    tracemalloc.start()
    try:
        for off in range(0, len(source), 65536):
            imp.feed(source[off : off + 65536])
        imp.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * CHUNK_DEFAULT, f"importing 32 MiB held {peak} bytes at once"


@pytest.mark.parametrize("bad", [0, -1, CHUNK_MAX + 1, 1.5, True, "1024"])
def test_chunk_size_is_checked(bad):
    with pytest.raises(ValueError):
        Importer(bad)


def test_chunk_size_limits_accepted():
    assert Importer(1).chunk_size == 1 and Importer(CHUNK_MAX).chunk_size == CHUNK_MAX
    assert Importer().chunk_size == CHUNK_DEFAULT == 1024 * 1024


def test_an_importer_finishes_once():
    imp = Importer(4)
    imp.finish()
    with pytest.raises(ValueError):
        imp.feed(b"more")
    with pytest.raises(ValueError):
        imp.finish()


# -- dag-pb --------------------------------------------------------------------------------------

C1 = Cid.of(b"one")
C2 = Cid.of(b"two", DAG_PB)


def link(cid_bytes: bytes, tail: bytes = b"") -> bytes:
    """A PBNode Links field around a Hash of ``cid_bytes`` followed by ``tail`` link fields."""
    body = b"\x0a" + uvarint(len(cid_bytes)) + cid_bytes + tail
    return b"\x12" + uvarint(len(body)) + body


def test_dagpb_canonical_bytes():
    block = dagpb.encode([(C1, "", 3)], b"\x08\x02")
    assert block == link(C1.bytes, b"\x12\x00\x18\x03") + b"\x0a\x02\x08\x02"
    assert dagpb.decode(block) == dagpb.PBNode([dagpb.PBLink(C1, "", 3)], b"\x08\x02")
    assert dagpb.encode([(C1, None, None)]) == link(C1.bytes), "absent Name, Tsize and Data are left out"
    assert dagpb.encode([], b"") == b"\x0a\x00", "empty Data is written"
    assert dagpb.decode(b"") == dagpb.PBNode([], None)
    assert str(Cid.of(dagpb.encode([]), DAG_PB)) == "bafybeihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


def test_dagpb_sorts_links_by_name_bytes_stably():
    links = [(C1, "b", 1), (C2, "a", 2), (C1, "", 3), (C2, None, 4), (C2, "a", 5)]
    got = dagpb.decode(dagpb.encode(links)).links
    assert [(l.name, l.tsize) for l in got] == [("", 3), (None, 4), ("a", 2), ("a", 5), ("b", 1)]


def test_dagpb_reads_a_cidv0_hash():
    v0 = b"\x12\x20" + C2.digest
    assert dagpb.decode(link(v0)).links[0].cid == C2


def test_dagpb_encode_refuses_what_decode_would():
    with pytest.raises(ValueError):
        dagpb.encode([(C1, "", 1)] * 175)
    with pytest.raises(ValueError):
        dagpb.encode([(C1, "", -1)])
    with pytest.raises(ValueError):
        dagpb.encode([(C1, "", 1 << 64)])
    with pytest.raises(ValueError):
        dagpb.encode([("not a cid", "", 1)])
    with pytest.raises(ValueError):
        dagpb.encode([], b"x" * dagpb.MAX_BLOCK)


GOOD_LINK = link(C1.bytes, b"\x12\x00\x18\x05")
MALFORMED = {
    "unknown node field": GOOD_LINK + b"\x1a\x00",
    "Data as varint": b"\x08\x01",
    "Links as varint": b"\x10\x01",
    "Data before Links": b"\x0a\x00" + GOOD_LINK,
    "Data repeated": b"\x0a\x00\x0a\x00",
    "unknown link field": link(C1.bytes, b"\x20\x01"),
    "Tsize length-delimited": link(C1.bytes, b"\x1a\x01\x05"),
    "Hash as varint": b"\x12\x02\x08\x01",
    "Name as varint": link(C1.bytes, b"\x10\x00"),
    "Name before Hash": b"\x12" + uvarint(2 + 2 + len(C1.bytes)) + b"\x12\x00\x0a" + uvarint(len(C1.bytes)) + C1.bytes,
    "Tsize before Name": link(C1.bytes, b"\x18\x05\x12\x00"),
    "Hash repeated": link(C1.bytes, b"\x0a" + uvarint(len(C1.bytes)) + C1.bytes),
    "Name repeated": link(C1.bytes, b"\x12\x00\x12\x00"),
    "Tsize repeated": link(C1.bytes, b"\x18\x01\x18\x01"),
    "link without Hash": b"\x12\x02\x18\x01",
    "Hash not a CID": link(b"\x01\x55"),
    "Hash with an unsupported codec": link(b"\x01\x71\x12\x20" + bytes(32)),
    "Hash with an unsupported hash": link(b"\x01\x55\x13\x40" + bytes(64)),
    "Hash with trailing bytes": link(C1.bytes + b"\x00"),
    "Name not UTF-8": link(C1.bytes, b"\x12\x01\xff"),
    "non-minimal tag": b"\x8a\x00\x00",
    "non-minimal length": b"\x0a\x80\x00",
    "non-minimal Tsize": link(C1.bytes, b"\x18\x85\x00"),
    "varint over 10 bytes": link(C1.bytes, b"\x18" + b"\xff" * 10 + b"\x01"),
    "varint over 64 bits": link(C1.bytes, b"\x18" + b"\xff" * 9 + b"\x02"),
    "truncated varint": link(C1.bytes, b"\x18\xff"),
    "truncated tag": b"\x80",
    "Data longer than the block": b"\x0a\x05abc",
    "link longer than the block": GOOD_LINK[:-1],
    "group wire type": b"\x0b",
    "175 links": GOOD_LINK * 175,
    "over MAX_BLOCK": b"\x0a" + uvarint(dagpb.MAX_BLOCK) + bytes(dagpb.MAX_BLOCK),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_dagpb_refuses(name):
    with pytest.raises(BadBlock) as e:
        dagpb.decode(MALFORMED[name])
    assert str(e.value)


def test_dagpb_limits_accepted():
    assert len(dagpb.decode(GOOD_LINK * 174).links) == 174
    big = b"\x0a" + uvarint(dagpb.MAX_BLOCK - 5) + bytes(dagpb.MAX_BLOCK - 5)
    assert len(big) == dagpb.MAX_BLOCK and len(dagpb.decode(big).data) == dagpb.MAX_BLOCK - 5
    assert dagpb.decode(link(C1.bytes, b"\x18" + b"\xff" * 9 + b"\x01")).links[0].tsize == (1 << 64) - 1


# -- UnixFS Data ---------------------------------------------------------------------------------


def test_unixfs_data_round_trip():
    for ufs in [
        UnixFSData(FILE, filesize=0),
        UnixFSData(FILE, data=b"abc", filesize=10, blocksizes=(3, 4)),
        UnixFSData(DIRECTORY, mode=0o755, mtime=(-5, None)),
        UnixFSData(FILE, filesize=1, blocksizes=(1,), mode=0o644, mtime=(1_700_000_000, 999_999_999)),
        UnixFSData(5, hash_type=0x22, fanout=256),
    ]:
        assert UnixFSData.decode(ufs.encode()) == ufs
    assert UnixFSData(FILE, data=b"", filesize=0).encode() == b"\x08\x02\x18\x00", "empty data is left out"


UFS_MALFORMED = {
    "no Type": b"\x18\x00",
    "unknown type": b"\x08\x06",
    "fields out of order": b"\x08\x02\x18\x01\x12\x01a",
    "filesize repeated": b"\x08\x02\x18\x01\x18\x01",
    "blocksizes not in one run": b"\x08\x02\x20\x01\x28\x01\x20\x01",
    "packed blocksizes": b"\x08\x02\x22\x02\x01\x02",
    "unknown field": b"\x08\x02\x48\x01",
    "field 0": b"\x00\x01",
    "Type as bytes": b"\x0a\x01\x02",
    "truncated Data": b"\x08\x02\x12\x05ab",
    "non-minimal filesize": b"\x08\x02\x18\x80\x00",
    "mode over 32 bits": b"\x08\x02\x38" + uvarint(1 << 32),
    "mtime without Seconds": b"\x08\x02\x42\x05\x15\x01\x00\x00\x00",
    "mtime nanoseconds 0": b"\x08\x02\x42\x07\x08\x01\x15\x00\x00\x00\x00",
    "mtime nanoseconds over 1e9": b"\x08\x02\x42\x07\x08\x01\x15" + (10**9).to_bytes(4, "little"),
    "mtime trailing field": b"\x08\x02\x42\x04\x08\x01\x18\x01",
    "175 blocksizes": b"\x08\x02" + b"\x20\x01" * 175,
}


@pytest.mark.parametrize("name", UFS_MALFORMED)
def test_unixfs_data_refuses(name):
    with pytest.raises(BadBlock):
        UnixFSData.decode(UFS_MALFORMED[name])


# -- the walker: hostile DAGs --------------------------------------------------------------------


def file_node(
    links, data: bytes = b"", *, filesize=None, sizes=None, kind=FILE, tsizes=None, names=None, **extra
) -> tuple[Cid, bytes]:
    """A File node over ``links`` [(cid, block)] with the sizes the importer would write (or those given)."""
    store = {}
    real_sizes, real_tsizes = [], []
    for cid, block in links:
        if cid.codec == RAW:
            real_sizes.append(len(block))
            real_tsizes.append(len(block))
        else:
            node = dagpb.decode(block)
            real_sizes.append(UnixFSData.decode(node.data).filesize)
            real_tsizes.append(len(block) + sum(l.tsize for l in node.links))
        store[cid] = block
    sizes = real_sizes if sizes is None else sizes
    tsizes = real_tsizes if tsizes is None else tsizes
    names = [""] * len(links) if names is None else names
    total = len(data) + sum(sizes) if filesize is None else filesize
    ufs = UnixFSData(kind, data=data or None, filesize=total, blocksizes=tuple(sizes), **extra).encode()
    block = dagpb.encode([(cid, name, t) for (cid, _), name, t in zip(links, names, tsizes)], ufs)
    return Cid.of(block, DAG_PB), block


def leaf(data: bytes) -> tuple[Cid, bytes]:
    return Cid.of(data, RAW), data


def refused(root, block, others, match):
    """Fetching the file whose root is (root, block) over the blocks ``others`` fails with ``match``."""
    store = dict(others)
    store[root] = block
    with pytest.raises(BadBlock, match=match):
        fetch(root, store)


def test_walker_refuses_a_wrong_block_and_can_take_the_right_one():
    data = gen(100)
    root, blocks = build(data, 10)
    store = dict(blocks)
    walker = Walker(root)
    assert walker.wants() == [root]
    with pytest.raises(BadBlock, match="does not match"):
        walker.add(root, store[root] + b"x")
    assert walker.wants() == [root], "a block that is not the one named changes nothing"
    assert walker.add(root, store[root]) == []
    out = b""
    for cid in walker.wants(20):
        out += b"".join(bytes(p) for _, p in walker.add(cid, store[cid]))
    assert walker.done and out == data and walker.filesize == 100


def test_walker_refuses_sizes_that_do_not_add_up():
    a, b = leaf(b"aaaa"), leaf(b"bbb")
    refused(*file_node([a, b], filesize=8), [a, b], "filesize 8 but")
    root, block = file_node([a, b], sizes=[4, 4])
    refused(root, block, [a, b], "raw leaf of 3 bytes where its parent declared 4")
    root, block = file_node([a, b], tsizes=[4, 4])
    refused(root, block, [a, b], "Tsize says 4")
    inner = file_node([a, b])
    root, block = file_node([inner], sizes=[8])
    refused(root, block, [inner, a, b], "node of 7 content bytes where its parent declared 8")
    root, block = file_node([inner], tsizes=[1])
    refused(root, block, [inner, a, b], "total size")
    ufs = UnixFSData(FILE, filesize=4, blocksizes=(4, 0)).encode()
    block = dagpb.encode([(a[0], "", 4)], ufs)
    refused(Cid.of(block, DAG_PB), block, [a], "1 links but 2 blocksizes")


def test_walker_refuses_other_malformed_nodes():
    a, e = leaf(b"aaaa"), leaf(b"")
    refused(*file_node([a, e]), [a, e], "declares 0 bytes")
    refused(*file_node([a], names=["x"]), [a], "has a name")
    refused(*file_node([a], tsizes=[None]), [a], "no Tsize")
    refused(*file_node([a], hash_type=0x22), [a], "hashType")
    refused(*file_node([a], kind=DIRECTORY, filesize=None), [a], "UnixFS Directory node")
    refused(*file_node([], b"raw-type leaf", kind=RAW_TYPE), [], "UnixFS Raw node")
    bare = dagpb.encode([(a[0], "", 4)])
    refused(Cid.of(bare, DAG_PB), bare, [a], "without UnixFS Data")
    no_size = dagpb.encode([], UnixFSData(FILE).encode())
    refused(Cid.of(no_size, DAG_PB), no_size, [], "without filesize")
    junk = b"\xff\xff"
    refused(Cid.of(junk, DAG_PB), junk, [], "varint")


def test_walker_refuses_too_many_links():
    leaves = [leaf(bytes([i % 256, i // 256])) for i in range(175)]
    ufs = UnixFSData(FILE, filesize=350, blocksizes=(2,) * 174).encode()
    body = b"".join(link(c.bytes, b"\x12\x00\x18\x02") for c, _ in leaves) + b"\x0a" + uvarint(len(ufs)) + ufs
    refused(Cid.of(body, DAG_PB), body, [*leaves], "more than 174 links")


def test_walker_refuses_a_link_to_an_unknown_codec():
    ufs = UnixFSData(FILE, filesize=4, blocksizes=(4,)).encode()
    body = (
        link(b"\x01\x71\x12\x20" + hashlib.sha256(b"x").digest(), b"\x12\x00\x18\x04")
        + b"\x0a"
        + uvarint(len(ufs))
        + ufs
    )
    refused(Cid.of(body, DAG_PB), body, [], "not a CID we support")
    cbor = base64.b32encode(b"\x01\x71\x12\x20" + bytes(32)).decode().lower().rstrip("=")
    with pytest.raises(InvalidCid):
        Walker("b" + cbor)  # a dag-cbor root


def test_walker_refuses_an_oversized_leaf():
    big = bytes(CHUNK_MAX + 1)
    walker = Walker(Cid.of(big, RAW))
    with pytest.raises(BadBlock, match="over the limit"):
        walker.add(walker.root, big)
    fine = bytes(CHUNK_MAX)
    assert len(b"".join(p for _, p in Walker(Cid.of(fine, RAW)).add(Cid.of(fine, RAW), fine))) == CHUNK_MAX
    child = leaf(big)
    root, block = file_node([child])
    refused(root, block, [child], "over the limit")


def test_walker_refuses_a_dag_deeper_than_the_file_needs():
    assert [max_depth(n) for n in (0, 1, 174, 175, 174**2, 174**2 + 1, 2**30, 2**64 - 1)] == [1, 1, 2, 3, 3, 4, 6, 10]
    x = leaf(b"z")
    chain = [file_node([x])]
    for _ in range(3):
        chain.append(file_node([chain[-1]]))
    assert fetch(chain[0][0], dict([x, chain[0]]))[0] == b"z", "one node over one byte: depth 1 is allowed"
    refused(*chain[1], [x, *chain], "deeper than 1 links")
    refused(*chain[3], [x, *chain], "deeper than 1 links")


def test_walker_reads_inline_data_first_and_accepts_mode_and_mtime():
    a, b = leaf(b"aaaa"), leaf(b"bb")
    root, block = file_node([a, b], b"head:", mode=0o600, mtime=(1_700_000_000, 5))
    out, asked, _ = fetch(root, {root: block, **dict([a, b])}, window=1, reverse=False)
    assert out == b"head:aaaabb" and asked == [root, a[0], b[0]]
    solo = file_node([], b"just data")
    assert fetch(solo[0], dict([solo]))[0] == b"just data"


def test_a_failed_walk_keeps_failing():
    a = leaf(b"aaaa")
    root, block = file_node([a], sizes=[5], filesize=5)
    walker = Walker(root)
    walker.add(root, block)
    with pytest.raises(BadBlock):
        walker.add(*a)
    with pytest.raises(BadBlock):
        walker.wants()
    with pytest.raises(BadBlock):
        walker.add(*a)


def test_repeated_children_are_fetched_once_and_bounded_by_filesize():
    x = leaf(b"xyz")
    inner = file_node([x] * 174)
    root, block = file_node([inner] * 174)
    store = dict([x, inner, (root, block)])
    out, asked, _ = fetch(root, store, window=32)
    assert out == b"xyz" * 174 * 174
    assert sorted(map(str, asked)) == sorted(map(str, [root, inner[0], x[0]])), (
        "a repeated block is kept, not fetched again"
    )
    assert sum(len(p) for _, p in walk(root, store.__getitem__)) == 3 * 174 * 174


def test_a_repeated_subtree_is_read_a_bounded_step_at_a_time():
    """Three blocks make 30,276 places: no single add or advance reads more than a step of them
    (a node loop is never held for long), and reading on gives every byte in order."""
    from lattica.content import _unixfs as unixfs

    x = leaf(b"q")
    inner = file_node([x] * 174)
    root, block = file_node([inner] * 174)
    store = dict([x, inner, (root, block)])
    walker = Walker(root)
    out = bytearray()
    for cid in [root, inner[0], x[0]]:
        assert walker.wants(8)[:1] == [cid]
        pieces = walker.add(cid, store[cid])
        assert len(pieces) <= unixfs._STEP
        out += b"".join(bytes(p) for _, p in pieces)
    rounds = 0
    while walker.ready:
        pieces = walker.advance()
        assert 0 < len(pieces) <= unixfs._STEP
        out += b"".join(bytes(p) for _, p in pieces)
        rounds += 1
    assert walker.done and bytes(out) == b"q" * 174 * 174
    assert rounds >= 174 * 174 // unixfs._STEP - 1
    assert walker.advance() == []


def test_a_dag_with_more_places_than_the_limit_is_refused(monkeypatch):
    from lattica.content import _unixfs as unixfs

    x = leaf(b"q")
    inner = file_node([x] * 174)
    root, block = file_node([inner] * 174)
    store = dict([x, inner, (root, block)])
    monkeypatch.setattr(unixfs, "MAX_PLACES", 174 * 175)  # 30,450: one place short of the 30,451 it has
    with pytest.raises(BadBlock, match="more than 30450 places"):
        fetch(root, store)
    with pytest.raises(BadBlock, match="places"):
        read_all(root, store.items())
    monkeypatch.setattr(unixfs, "MAX_PLACES", 174 * 175 + 1)
    assert read_all(root, store.items()) == b"q" * 174 * 174


def test_a_walker_without_data_keeps_no_leaf_bytes_however_far_ahead_they_come():
    """A fetcher that stores blocks itself walks with data=False: leaves given long before the
    walk reaches them hold no memory, are still checked, and every place is handed out (as
    zeros of its length)."""
    data = gen(64 * 300)
    root, blocks = build(data, 64)
    store = dict(blocks)
    walker = Walker(root, data=False)
    walker.add(root, store[root])
    nodes = walker.wants(1000)
    for cid in nodes:
        walker.add(cid, store[cid])
    leaves = walker.wants(1000)
    assert len(leaves) == 300
    handed = []
    nodes_bytes = walker.held_bytes  # the nodes not yet entered (no leaf bytes ever join them)
    assert nodes_bytes < 64 * 174
    for cid in reversed(leaves):  # the last first: all but one arrive ahead of the walk
        handed += walker.add(cid, store[cid])
        assert walker.held_bytes <= nodes_bytes
    assert walker.done and [o for o, _ in handed] == list(range(0, 64 * 300, 64))
    assert sum(len(p) for _, p in handed) == len(data) and not any(bytes(p).strip(b"\0") for _, p in handed)
    bad = Walker(root, data=False)
    bad.add(root, store[root])
    first = bad.wants(1)[0]
    with pytest.raises(BadBlock):
        bad.add(first, store[first] + b"x")


def test_keeping_repeats_is_bounded():
    x, y = leaf(b"x" * 64), leaf(b"y" * 64)
    root, block = file_node([x, y] * 87)
    walker_store = dict([x, y, (root, block)])
    walker = Walker(root, keep_bytes=400)  # room for one repeat only (64 bytes + 256): the other is fetched again
    asked, out = [], b""
    while not walker.done:
        for cid in walker.wants(1):
            asked.append(cid)
            out += b"".join(bytes(p) for _, p in walker.add(cid, walker_store[cid]))
        assert walker.held_bytes <= 64
    assert out == (b"x" * 64 + b"y" * 64) * 87
    assert asked.count(x[0]) == 1 and asked.count(y[0]) == 87


# -- the walker: fetching ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 174 * 64, 175 * 64, 174 * 174 * 2 + 1])
def test_walker_round_trip_with_out_of_order_blocks(size):
    chunk = 2 if size > 175 * 64 else 64
    data = gen(size)
    root, blocks = build(data, chunk)
    out, asked, peak = fetch(root, dict(blocks), window=8)
    assert out == data
    assert set(asked) == set(dict(blocks)), "every block is asked for"
    if size <= 175 * 64:
        assert len(asked) == len(blocks), "and once (these blocks are all different)"
    assert peak <= 8 * max(len(b) for _, b in blocks), "what is held is bounded by the window"


def test_walker_window_bounds_memory_with_big_leaves():
    data = gen(300 * 1024)
    root, blocks = build(data, 1024)
    out, _, peak = fetch(root, dict(blocks), window=4)
    assert out == data and peak <= 4 * 1024 + 2 * 11_000


def test_unasked_and_duplicate_blocks_are_ignored():
    data = gen(50)
    root, blocks = build(data, 10)
    store = dict(blocks)
    walker = Walker(root)
    leaf0 = next(c for c in store if c.codec == RAW)
    assert walker.add(leaf0, store[leaf0]) == [], "not asked yet"
    walker.add(root, store[root])
    assert walker.add(root, store[root]) == [], "already here"
    assert walker.add(Cid.of(b"stranger"), b"stranger") == []
    out = b""
    while not walker.done:
        for cid in walker.wants(2):
            out += b"".join(bytes(p) for _, p in walker.add(cid, store[cid]))
    assert out == data


def test_range_reads_fetch_only_what_they_need():
    data = gen(175 * 4)
    root, blocks = build(data, 4)
    store = dict(blocks)
    out, asked, _ = fetch(root, store, start=10, end=30)
    assert out == data[10:30]
    assert sum(c.codec == RAW for c in asked) == 6 and len(asked) == 8, "leaves 2..7, the root and one node"
    out, asked, _ = fetch(root, store, start=696)
    assert out == data[696:] and len(asked) == 3, "the root, the last node and its leaf"
    assert fetch(root, store, start=1000)[0] == b""
    assert fetch(root, store, start=5, end=5) == (b"", [root], 0)
    with pytest.raises(ValueError):
        Walker(root, start=5, end=4)


def test_resume_from_an_offset_and_from_held_blocks():
    data = gen(1000)
    root, blocks = build(data, 7)  # 143 leaves under one node
    network = dict(blocks)
    _, first_run, _ = fetch(root, network, end=500)  # interrupted after 500 bytes
    local = {cid: network[cid] for cid in first_run}
    walker = Walker(root, start=500)
    out, fetched = bytearray(), 0
    while not walker.done:
        for cid in walker.wants(16):
            block = local.get(cid)
            if block is None:
                block, fetched = network[cid], fetched + 1
            for offset, piece in walker.add(cid, block):
                assert offset == 500 + len(out)
                out += piece
    assert out == data[500:] and walker.offset == 1000
    assert fetched == 142 - 500 // 7, "only the leaves after the one holding byte 500 come from the network"


def test_walk_reads_from_a_getter_and_children_lists_links():
    data = gen(700)
    root, blocks = build(data, 4)
    store = dict(blocks)
    assert b"".join(bytes(p) for _, p in walk(root, store.__getitem__, start=100, end=200)) == data[100:200]
    kids = children(root, store[root])
    assert len(kids) == 2 and all(c.codec == DAG_PB for c in kids)
    assert children(kids[1], store[kids[1]]) == [Cid.of(data[-4:], RAW)]
    assert children(Cid.of(b"leaf"), b"leaf") == []
    with pytest.raises(BadBlock):
        children(root, store[kids[0]])


# -- fuzz ----------------------------------------------------------------------------------------

DAG_ROOT, DAG_BLOCKS = build(gen(175 * 4), 4)
DAG_STORE = dict(DAG_BLOCKS)
DAG_NODES = [DAG_ROOT, *(link.cid for link in dagpb.decode(DAG_STORE[DAG_ROOT]).links)]


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_dagpb_decode(data):
    try:
        node = dagpb.decode(data)
    except BadBlock as e:
        assert str(e)
        return
    names = [(link.name or "").encode() for link in node.links]
    hashes = b"".join(link.cid.bytes for link in node.links)
    if names == sorted(names) and hashes in data:  # (sorted, and no CIDv0 hash to rewrite as v1)
        assert dagpb.encode(node.links, node.data) == data, "what is accepted is canonical"


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_unixfs_data_decode(data):
    try:
        UnixFSData.decode(data)
    except BadBlock:
        pass


@FUZZ
@given(st.binary(max_size=400), st.booleans())
def test_fuzz_walker_on_random_blocks(data, raw):
    cid = Cid.of(data, RAW if raw else DAG_PB)
    walker = Walker(cid)
    try:
        out = walker.add(cid, data)
        while not walker.done:
            for child in walker.wants(4):
                walker.add(child, DAG_STORE.get(child, b"missing"))
    except (BadBlock, InvalidCid):
        return
    if raw:
        assert b"".join(bytes(p) for _, p in out) == data


@FUZZ
@given(st.data())
def test_fuzz_walker_on_mutated_dags(data):
    victim = data.draw(st.sampled_from(DAG_NODES))
    block = bytearray(DAG_STORE[victim])
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(block) - 1))
        op = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        if op == "flip":
            block[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            block[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del block[i:]
        else:
            block[i:i] = data.draw(st.binary(min_size=1, max_size=3))
        if not block:
            block += b"\x00"
    store = dict(DAG_STORE)
    if victim == DAG_ROOT:
        root = Cid.of(bytes(block), DAG_PB)
        store[root] = bytes(block)
    else:  # a mutated child under a root that names it
        child = Cid.of(bytes(block), DAG_PB)
        store[child] = bytes(block)
        top = dagpb.decode(DAG_STORE[DAG_ROOT])
        block = dagpb.encode([l._replace(cid=child) if l.cid == victim else l for l in top.links], top.data)
        root = Cid.of(block, DAG_PB)
        store[root] = block
    walker = Walker(root)
    total = 0
    try:
        while not walker.done:
            for cid in walker.wants(8):
                total += sum(len(p) for _, p in walker.add(cid, store.get(cid, b"absent")))
    except (BadBlock, InvalidCid):
        return
    assert total == walker.filesize
