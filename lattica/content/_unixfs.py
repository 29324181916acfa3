"""UnixFS files as the IPFS importer builds them, and a strict sans-IO walker to fetch them.

The importer gives the root CID ``ipfs add --cid-version 1 --raw-leaves --chunker size-N`` gives
for the same bytes (balanced layout, 174 links per node), streaming: it holds one chunk and the
pending link lists, never the file. The walker reads such a DAG back block by block as a fetcher
receives them, checks every block against its CID and its parent, and hands out the bytes in
file order, so a peer can neither make us hold more than a bounded window nor work past what the
root's file size allows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, final

from lattica._protobuf import uvarint
from lattica.content import _dagpb as dagpb
from lattica.content._cid import DAG_PB, RAW, Cid
from lattica.content._dagpb import MAX_BLOCK, MAX_LINKS, read_varint
from lattica.errors import BadBlock

__all__ = [
    "Block",
    "CHUNK_DEFAULT",
    "CHUNK_MAX",
    "MIN_CHUNK",
    "MAX_LINKS",
    "RAW_TYPE",
    "DIRECTORY",
    "FILE",
    "METADATA",
    "SYMLINK",
    "HAMT_SHARD",
    "UnixFSData",
    "Importer",
    "build",
    "max_depth",
    "children",
    "Walker",
    "walk",
]

Block = bytes | memoryview
"""A block's bytes: the importer hands out leaves as read-only memoryviews (onto the caller's
``bytes`` or onto a buffer nobody writes again), so publishing a file copies no chunk twice."""

CHUNK_DEFAULT: Final = 1024 * 1024
CHUNK_MAX: Final = 2 * 1024 * 1024
"""The largest chunk (raw leaf) we make or accept: what IPFS peers exchange as one block."""

MIN_CHUNK: Final = 1
"""The smallest leaf content the depth bound assumes (see ``max_depth``). The importer accepts
any chunk size from 1 byte up, so the walker must too; the bound stays tiny regardless."""

RAW_TYPE, DIRECTORY, FILE, METADATA, SYMLINK, HAMT_SHARD = range(6)
_TYPE_NAMES: Final = ("Raw", "Directory", "File", "Metadata", "Symlink", "HAMTShard")
_MAX_U64: Final = (1 << 64) - 1
_MAX_U32: Final = (1 << 32) - 1
_DEFAULT_KEEP: Final = 8 * 1024 * 1024
_KEEP_COST: Final = 256  # what keeping one block costs besides its bytes (dict entries, objects)
_STEP: Final = 4096  # places one add()/advance() reads at most: a node loop never stalls on one call

MAX_PLACES: Final = 1 << 22
"""The most places (links followed, repeats included) a file's DAG may have: 4 Ti B in chunks of
1 MiB, 1 TiB in IPFS's 256 KiB ones. It bounds the work a few hostile blocks can cause: a DAG that
repeats one subtree declares a huge file from a handful of blocks, and reading it visits every
place."""

assert MAX_BLOCK > CHUNK_MAX  # a node may carry a full chunk inline


def _check_u(value: object, limit: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ValueError(f"{what} must be an integer in 0..{limit}, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class UnixFSData:
    """The UnixFS ``Data`` message a dag-pb node carries in its Data field.

    ``type`` is one of RAW_TYPE..HAMT_SHARD; for a File, ``data`` is content held in the node
    itself (before its children's), ``filesize`` the node's whole content size and ``blocksizes``
    the content size under each link. ``mtime`` is (seconds, nanoseconds or None)."""

    type: int
    data: bytes | None = None
    filesize: int | None = None
    blocksizes: tuple[int, ...] = ()
    hash_type: int | None = None
    fanout: int | None = None
    mode: int | None = None
    mtime: tuple[int, int | None] | None = None

    @property
    def content_size(self) -> int:
        """What this node's own data and its links' declared sizes add up to."""
        return len(self.data or b"") + sum(self.blocksizes)

    def encode(self) -> bytes:
        """The protobuf in field order, as the IPFS importer writes it (empty ``data`` left out)."""
        _check_u(self.type, HAMT_SHARD, "UnixFS type")
        out = bytearray((0x08, self.type))
        if self.data:
            out += b"\x12" + uvarint(len(self.data)) + self.data
        if self.filesize is not None:
            out += b"\x18" + uvarint(_check_u(self.filesize, _MAX_U64, "filesize"))
        for size in self.blocksizes:
            out += b"\x20" + uvarint(_check_u(size, _MAX_U64, "a blocksize"))
        if self.hash_type is not None:
            out += b"\x28" + uvarint(_check_u(self.hash_type, _MAX_U64, "hashType"))
        if self.fanout is not None:
            out += b"\x30" + uvarint(_check_u(self.fanout, _MAX_U64, "fanout"))
        if self.mode is not None:
            out += b"\x38" + uvarint(_check_u(self.mode, _MAX_U32, "mode"))
        if self.mtime is not None:
            secs, nsecs = self.mtime
            if not isinstance(secs, int) or not -(1 << 63) <= secs < 1 << 63:
                raise ValueError(f"mtime seconds must be a 64-bit signed integer, not {secs!r}")
            body = b"\x08" + uvarint(secs & _MAX_U64)
            if nsecs is not None:
                if not isinstance(nsecs, int) or not 1 <= nsecs <= 999_999_999:
                    raise ValueError(f"mtime nanoseconds must be in 1..999999999 (or None), not {nsecs!r}")
                body += b"\x15" + nsecs.to_bytes(4, "little")
            out += b"\x42" + uvarint(len(body)) + body
        return bytes(out)

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> UnixFSData:
        """Decode strictly: BadBlock unless the message is in the canonical form ``encode`` writes.

        Refused: unknown fields or wire types, fields out of order or repeated (blocksizes are
        one run of unpacked varints, at most MAX_LINKS of them), a missing or unknown Type,
        non-minimal or over-long varints, truncation, and an mtime that is not Seconds then an
        optional FractionalNanoseconds in 1..999999999."""
        b = buf if isinstance(buf, bytes) else bytes(buf)
        end = len(b)
        fields: dict[int, object] = {}
        sizes: list[int] = []
        last = pos = 0
        while pos < end:
            tag, pos = read_varint(b, pos, "UnixFS field tag")
            number, wire = tag >> 3, tag & 7
            if not 1 <= number <= 8:
                raise BadBlock(f"UnixFS Data: unknown field {number}")
            if number < last or (number == last and number != 4):
                raise BadBlock(
                    f"UnixFS Data: field {number} after field {last} (fields are in increasing order, once each)"
                )
            last = number
            want = 2 if number in (2, 8) else 0
            if wire != want:
                hint = " (packed blocksizes are not what IPFS writes)" if number == 4 and wire == 2 else ""
                raise BadBlock(f"UnixFS Data: field {number} has wire type {wire}, not {want}{hint}")
            if want == 0:
                value, pos = read_varint(b, pos, f"UnixFS field {number}")
                if number == 4:
                    if len(sizes) == MAX_LINKS:
                        raise BadBlock(f"UnixFS Data has more than {MAX_LINKS} blocksizes")
                    sizes.append(value)
                else:
                    fields[number] = value
                continue
            length, pos = read_varint(b, pos, f"UnixFS field {number} length")
            if length > end - pos:
                raise BadBlock(f"truncated UnixFS field {number}: {length} bytes announced, {end - pos} left")
            fields[number] = b[pos : pos + length]
            pos += length
        if 1 not in fields:
            raise BadBlock("UnixFS Data has no Type")
        kind = fields[1]
        if not isinstance(kind, int) or kind > HAMT_SHARD:
            raise BadBlock(f"unknown UnixFS type {kind}")
        mode = fields.get(7)
        if mode is not None and mode > _MAX_U32:  # type: ignore[operator]
            raise BadBlock(f"UnixFS mode {mode} exceeds 32 bits")
        mtime = fields.get(8)
        return cls(
            type=kind,
            data=fields.get(2),  # type: ignore[arg-type]
            filesize=fields.get(3),  # type: ignore[arg-type]
            blocksizes=tuple(sizes),
            hash_type=fields.get(5),  # type: ignore[arg-type]
            fanout=fields.get(6),  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            mtime=None if mtime is None else _decode_mtime(mtime),  # type: ignore[arg-type]
        )


def _decode_mtime(b: bytes) -> tuple[int, int | None]:
    if not b or b[0] != 0x08:
        raise BadBlock("UnixFS mtime must start with its Seconds field")
    secs, pos = read_varint(b, 1, "UnixFS mtime Seconds")
    if secs >= 1 << 63:
        secs -= 1 << 64
    if pos == len(b):
        return secs, None
    if b[pos] != 0x15 or len(b) != pos + 5:
        raise BadBlock("UnixFS mtime: after Seconds only a 4-byte FractionalNanoseconds may follow")
    nsecs = int.from_bytes(b[pos + 1 :], "little")
    if not 1 <= nsecs <= 999_999_999:
        raise BadBlock(f"UnixFS mtime nanoseconds {nsecs} outside 1..999999999")
    return secs, nsecs


# -- importing -------------------------------------------------------------------------------


def _chunk_size(chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or not 1 <= chunk_size <= CHUNK_MAX:
        raise ValueError(f"the chunk size is an integer in 1..{CHUNK_MAX} bytes, not {chunk_size!r}")
    return chunk_size


class _Entry(NamedTuple):
    cid: Cid
    size: int  # content bytes under it
    tsize: int  # its block plus everything below it


class Importer:
    """A streaming UnixFS file importer: ``feed`` bytes as they come, then ``finish``.

    Every block is returned as soon as it is complete, children before parents: each full chunk
    as a raw leaf, and a File node as soon as 174 links are waiting at its level. The layout is
    the IPFS importer's (fixed-size chunker, raw leaves, balanced, CIDv1): a file of one chunk
    (the empty file too: an empty raw leaf) is that leaf; otherwise the leaves are grouped 174
    per node, those nodes 174 per node, and so on until one node is left, which is the root. A
    last group of a single entry is still wrapped in a node of one link (only the file's sole
    leaf stands for itself). Memory: one chunk plus at most 173 pending links per level."""

    def __init__(self, chunk_size: int = CHUNK_DEFAULT) -> None:
        self.chunk_size: Final = _chunk_size(chunk_size)
        self.size = 0
        self._buf: bytearray | None = None
        self._fill = 0
        self._levels: list[list[_Entry]] = [[]]
        self._counts: list[int] = [0]
        self._root: Cid | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[Cid, Block]]:
        """Add the next bytes of the file; return the blocks they completed.

        Chunks taken whole from a ``bytes`` argument are not copied: their blocks are read-only
        views onto it. Any other buffer is copied, since its owner may change it later."""
        if self._root is not None:
            raise ValueError("this importer has finished; start a new one")
        mv = memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        n = len(mv)
        self.size += n
        cs = self.chunk_size
        out: list[tuple[Cid, Block]] = []
        pos = 0
        if self._fill:
            assert self._buf is not None
            pos = min(cs - self._fill, n)
            self._buf[self._fill : self._fill + pos] = mv[:pos]
            self._fill += pos
            if self._fill == cs:
                self._leaf(memoryview(self._buf).toreadonly(), out)
                self._buf, self._fill = None, 0
        shared = isinstance(data, bytes)
        while n - pos >= cs:
            piece = mv[pos : pos + cs]
            self._leaf(piece if shared else memoryview(bytes(piece)), out)
            pos += cs
        if pos < n:
            self._buf = bytearray(cs)
            self._buf[: n - pos] = mv[pos:]
            self._fill = n - pos
        return out

    def finish(self) -> tuple[Cid, list[tuple[Cid, Block]]]:
        """End the file: return its root CID and the blocks still to come (the last leaf, the
        last node of each level and the root)."""
        if self._root is not None:
            raise ValueError("this importer has already finished")
        out: list[tuple[Cid, Block]] = []
        if self._fill or not self._counts[0]:
            last = b"" if self._buf is None else bytes(memoryview(self._buf)[: self._fill])
            self._buf, self._fill = None, 0
            self._leaf(memoryview(last), out)
        level = 0
        while self._counts[level] > 1:
            if self._levels[level]:
                self._reduce(level, out)
            level += 1
        self._root = self._levels[level][0].cid
        return self._root, out

    def _leaf(self, chunk: memoryview, out: list[tuple[Cid, Block]]) -> None:
        cid = Cid(RAW, hashlib.sha256(chunk).digest())
        out.append((cid, chunk))
        self._push(0, _Entry(cid, len(chunk), len(chunk)), out)

    def _push(self, level: int, entry: _Entry, out: list[tuple[Cid, Block]]) -> None:
        if level == len(self._levels):
            self._levels.append([])
            self._counts.append(0)
        self._levels[level].append(entry)
        self._counts[level] += 1
        if len(self._levels[level]) == MAX_LINKS:
            self._reduce(level, out)

    def _reduce(self, level: int, out: list[tuple[Cid, Block]]) -> None:
        entries, self._levels[level] = self._levels[level], []
        ufs = UnixFSData(FILE, filesize=sum(e.size for e in entries), blocksizes=tuple(e.size for e in entries))
        block = dagpb.encode([(e.cid, "", e.tsize) for e in entries], ufs.encode())
        cid = Cid(DAG_PB, hashlib.sha256(block).digest())
        out.append((cid, block))
        self._push(level + 1, _Entry(cid, ufs.filesize, len(block) + sum(e.tsize for e in entries)), out)  # type: ignore[arg-type]


def build(data: bytes | bytearray | memoryview, chunk_size: int = CHUNK_DEFAULT) -> tuple[Cid, list[tuple[Cid, Block]]]:
    """The root CID and every block of ``data`` as one UnixFS file (see ``Importer``)."""
    importer = Importer(chunk_size)
    blocks = importer.feed(data)
    root, rest = importer.finish()
    blocks += rest
    return root, blocks


# -- reading ---------------------------------------------------------------------------------


def max_depth(filesize: int) -> int:
    """The most links from the root to any leaf that a file of ``filesize`` bytes may need.

    A balanced DAG of n leaves has ceil(log174(n)) levels of nodes, and a file has at most
    ceil(filesize / MIN_CHUNK) leaves, since every leaf must hold at least MIN_CHUNK bytes
    (children of size 0 are refused). We allow one level more than that for other layouts, so
    the bound is 1 + ceil(log174(ceil(filesize / MIN_CHUNK))): 1 for a file of one leaf, 6 for
    1 GiB and never more than 10, as filesize < 2**64. A deeper DAG is refused; together with
    every child's size adding up to what its parent declared, this bounds the blocks of any DAG,
    however hostile, by about filesize * (1 + bound)."""
    leaves = max(1, -(-filesize // MIN_CHUNK))
    levels, reach = 0, 1
    while reach < leaves:
        levels += 1
        reach *= MAX_LINKS
    return 1 + levels


@dataclass(frozen=True, slots=True)
class _Node:
    """A checked UnixFS File node: its links, each one's declared content size and Tsize."""

    links: tuple[Cid, ...]
    sizes: tuple[int, ...]
    tsizes: tuple[int, ...]
    data: bytes
    filesize: int
    tsize: int  # its block plus its links' Tsizes: what a parent's link to it must say


def _check_node(cid: Cid, block: Block) -> _Node:
    """Decode a dag-pb block and check it is a well-formed UnixFS File node (on its own)."""
    node = dagpb.decode(block)
    if node.data is None:
        raise BadBlock(f"{cid}: dag-pb node without UnixFS Data")
    ufs = UnixFSData.decode(node.data)
    if ufs.type != FILE:
        raise BadBlock(f"{cid}: UnixFS {_TYPE_NAMES[ufs.type]} node where a File was expected")
    if ufs.hash_type is not None or ufs.fanout is not None:
        raise BadBlock(f"{cid}: a File node with hashType/fanout (those belong to HAMT directories)")
    if ufs.filesize is None:
        raise BadBlock(f"{cid}: a File node without filesize")
    if len(ufs.blocksizes) != len(node.links):
        raise BadBlock(f"{cid}: {len(node.links)} links but {len(ufs.blocksizes)} blocksizes")
    if ufs.filesize != ufs.content_size:
        raise BadBlock(f"{cid}: filesize {ufs.filesize} but Data and blocksizes add up to {ufs.content_size}")
    tsizes = []
    for i, link in enumerate(node.links):
        if not ufs.blocksizes[i]:
            raise BadBlock(f"{cid}: link {i} declares 0 bytes (an importer never links an empty child)")
        if link.name:
            raise BadBlock(f"{cid}: link {i} has a name ({link.name!r}); a file's links have none")
        if link.tsize is None:
            raise BadBlock(f"{cid}: link {i} has no Tsize")
        tsizes.append(link.tsize)
    return _Node(
        links=tuple(link.cid for link in node.links),
        sizes=ufs.blocksizes,
        tsizes=tuple(tsizes),
        data=ufs.data or b"",
        filesize=ufs.filesize,
        tsize=len(block) + sum(tsizes),
    )


def children(cid: Cid, block: Block) -> list[Cid]:
    """The CIDs a block of a UnixFS file links to, in order (none for a raw leaf); BadBlock if
    the block is not what ``cid`` names or not a File node."""
    if not cid.verify(block):
        raise BadBlock(f"the block given for {cid} does not match its hash")
    return [] if cid.codec == RAW else list(_check_node(cid, block).links)


class _Frame:
    """A node being read at one place in the file: its next link ``i`` starts at ``offset``."""

    __slots__ = ("cid", "links", "sizes", "tsizes", "depth", "i", "offset")

    def __init__(
        self, cid: Cid | None, links: tuple[Cid, ...], sizes: tuple, tsizes: tuple, depth: int, offset: int
    ) -> None:
        self.cid = cid
        self.links, self.sizes, self.tsizes = links, sizes, tsizes
        self.depth = depth  # of its children
        self.i = 0
        self.offset = offset


@final  # (final: ``type(b) is _Leaf`` then narrows both ways)
class _Leaf:
    """A raw leaf a walker without ``data`` checked and keeps only the length of: it hands out
    its place as a view of zero bytes of that length."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    @property
    def view(self) -> memoryview:
        return memoryview(_ZEROS)[: self.n] if self.n <= len(_ZEROS) else memoryview(bytes(self.n))


_ZEROS: Final = bytes(CHUNK_MAX)


class Walker:
    """Reads a UnixFS file block by block, sans-IO: ask ``wants()``, give each block to ``add()``.

    ``wants(limit)`` lists the blocks to fetch next, in file order: those of the next ``limit``
    places of the file ahead of what has been handed out (leaves and nodes, counting the ones
    already here), so what the walker holds is bounded by the window the fetcher chooses.
    ``add(cid, block)`` checks the block and returns the file bytes it made ready, in order, as
    ``(offset, memoryview)`` pieces; ``done`` is True once everything is out. Blocks that were
    not asked for (or came twice) are ignored, so a fetcher may pass on whatever peers send.

    Checks (BadBlock on any failure): every block matches its CID; a raw leaf has at most
    CHUNK_MAX bytes; a dag-pb block is a canonical node holding a UnixFS File with at most 174
    links, one blocksize per link, none of them 0, and filesize = own data + blocksizes; every
    child holds exactly the content size its parent declared and its block plus its own links'
    Tsizes equal the Tsize its parent gave it; no leaf is deeper than ``max_depth(filesize)``.
    A block that does not match its CID leaves the walk as it was (fetch it from someone else);
    any other failure means the DAG itself is malformed, and the walker then keeps raising it.

    To read a range (or to resume a download that already wrote ``start`` bytes), pass ``start``
    and ``end``: only the blocks under that range are fetched and only its bytes handed out. A
    block the fetcher already holds locally can be given to ``add`` as soon as ``wants`` lists it.
    A block read once is kept for a later place rather than fetched again when a link still ahead
    in the nodes being read names it, or when its parent is kept (a repeated subtree), up to
    ``keep_bytes`` in all (each block counting 256 bytes more than its length).

    ``data=False`` (a fetcher that stores blocks elsewhere and needs only the walk): raw leaves
    are checked as usual but only their lengths are kept, so blocks that arrive far ahead of the
    walk cost no memory; the pieces handed out are zero bytes of the right lengths.

    One ``add`` reads at most a few thousand places of the file; when it stopped there with the
    next place already held, ``ready`` is True and ``advance()`` hands out the next pieces (a
    repeated subtree can make millions of places out of a few blocks). A DAG of more than
    ``MAX_PLACES`` places is refused."""

    def __init__(
        self,
        root: Cid | str,
        *,
        start: int = 0,
        end: int | None = None,
        keep_bytes: int = _DEFAULT_KEEP,
        data: bool = True,
    ) -> None:
        self.root: Final = Cid.parse(root)
        self._data = data  # False: raw leaves are checked and counted, their bytes never kept (see ``add``)
        if not isinstance(start, int) or start < 0 or (end is not None and (not isinstance(end, int) or end < start)):
            raise ValueError(f"the range is 0 <= start <= end, not {start!r}..{end!r}")
        self.start: Final = start
        self.end: Final = end
        self.filesize: int | None = None
        self.offset = start  # the next byte to be handed out
        self.done = False
        self._keep_limit = keep_bytes
        self._stack = [_Frame(None, (self.root,), (None,), (None,), 0, 0)]
        self._depth_limit = 0
        self._held: dict[Cid, Block | _Leaf] = {}  # (a _Leaf: a raw leaf's length only, without ``data``)
        self._nodes: dict[Cid, _Node] = {}
        self._kept: dict[Cid, int] = {}  # held blocks already read once, kept for a later place: their cost
        self._kept_bytes = 0
        self._refs: dict[Cid, int] = {}  # links not yet passed in the frames being read
        self._asked: dict[Cid, tuple[int | None, int | None, int]] = {self.root: (None, None, 0)}
        self._error: BadBlock | None = None
        self._places = 0
        self.ready = False

    @property
    def held_bytes(self) -> int:
        """The bytes of the blocks the walker holds (arrived early, or kept for a repeat)."""
        return sum(len(b) for b in self._held.values() if type(b) is not _Leaf)

    def wants(self, limit: int = 16) -> list[Cid]:
        """The CIDs to fetch next (each once, in file order) among the next ``limit`` places."""
        if self._error is not None:
            raise self._error
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the window is at least 1 place, not {limit!r}")
        out: list[Cid] = []
        listed: set[Cid] = set()
        if self.done:
            return out
        view: list[list[Any]] = [[f.links, f.sizes, f.tsizes, f.depth, f.i, f.offset] for f in self._stack]
        places = 0
        while view and places < limit:
            frame = view[-1]
            links, sizes, tsizes, depth, i, offset = frame
            if i == len(links):
                view.pop()
                continue
            size = sizes[i]
            frame[4] = i + 1
            if size is not None:
                frame[5] = offset + size
                if not self._in_range(offset, size):
                    continue
            cid = links[i]
            places += 1
            node = self._nodes.get(cid)
            if node is not None:
                if node.links and node.filesize == size and node.tsize == tsizes[i] and depth < self._depth_limit:
                    view.append([node.links, node.sizes, node.tsizes, depth + 1, 0, offset + len(node.data)])
            elif cid not in self._held and cid not in listed:
                listed.add(cid)
                out.append(cid)
                self._asked.setdefault(cid, (size, tsizes[i], depth))
        return out

    def add(self, cid: Cid, block: Block, *, verified: bool = False) -> list[tuple[int, memoryview]]:
        """Take a fetched block; return the file bytes now ready, as (offset, bytes) in order.
        ``verified``: the caller already checked the block against its CID (hashing it twice at
        800 MB/s would cost a core)."""
        if self._error is not None:
            raise self._error
        cid = Cid.parse(cid)
        expected = self._asked.get(cid)
        if expected is None or self.done:
            return []
        if len(block) > (CHUNK_MAX if cid.codec == RAW else MAX_BLOCK):
            raise BadBlock(f"{cid}: a {cid.codec_name} block of {len(block)} bytes is over the limit")
        if not verified and not cid.verify(block):
            raise BadBlock(f"the block given for {cid} does not match its hash")
        del self._asked[cid]
        try:
            if cid.codec == DAG_PB:
                self._nodes[cid] = _check_node(cid, block)
            self._check_place(cid, block, *expected)
            self._held[cid] = block if self._data or cid.codec != RAW else _Leaf(len(block))
            return self._advance()
        except BadBlock as e:
            self._error = e
            raise

    def advance(self) -> list[tuple[int, memoryview]]:
        """The next pieces from blocks already held (call while ``ready``)."""
        if self._error is not None:
            raise self._error
        if self.done:
            return []
        try:
            return self._advance()
        except BadBlock as e:
            self._error = e
            raise

    def _in_range(self, offset: int, size: int) -> bool:
        return offset + size > self.start and (self.end is None or offset < self.end > self.start)

    def _check_place(self, cid: Cid, block: Block | _Leaf, size: int | None, tsize: int | None, depth: int) -> None:
        """Check a block against what its parent declared for the place it fills."""
        node = self._nodes.get(cid)
        if size is None:  # the root: it declares the file's size
            self.filesize = len(block) if node is None else node.filesize
            self._depth_limit = max_depth(self.filesize)
        elif node is None:
            if len(block) != size:
                raise BadBlock(f"{cid}: raw leaf of {len(block)} bytes where its parent declared {size}")
            if tsize != len(block):
                raise BadBlock(f"{cid}: raw leaf of {len(block)} bytes where its parent's Tsize says {tsize}")
        else:
            if node.filesize != size:
                raise BadBlock(f"{cid}: node of {node.filesize} content bytes where its parent declared {size}")
            if node.tsize != tsize:
                raise BadBlock(f"{cid}: node with a total size of {node.tsize} where its parent's Tsize says {tsize}")
        if node is not None and node.links and depth >= self._depth_limit:
            raise BadBlock(
                f"{cid}: the DAG is deeper than {self._depth_limit} links, the most a file of {self.filesize} bytes needs"
            )

    def _advance(self) -> list[tuple[int, memoryview]]:
        out: list[tuple[int, memoryview]] = []
        stack = self._stack
        steps = 0
        self.ready = False
        while stack:
            frame = stack[-1]
            i = frame.i
            if i == len(frame.links):
                stack.pop()
                continue
            if steps == _STEP:
                self.ready = True
                return out
            cid, size, offset = frame.links[i], frame.sizes[i], frame.offset
            skip = size is not None and not self._in_range(offset, size)
            block = None if skip else self._held.get(cid)
            if block is None and not skip:
                self._asked.setdefault(cid, (size, frame.tsizes[i], frame.depth))
                return out
            steps += 1
            self._places += 1
            if self._places > MAX_PLACES:
                raise BadBlock(
                    f"{self.root}: the DAG has more than {MAX_PLACES} places; no file this walker reads has as many"
                )
            if skip:
                frame.i, frame.offset = i + 1, offset + size
                self._unref(cid)
                continue
            assert block is not None  # (not skipped: held, or the walk returned above)
            if size is not None:
                self._check_place(cid, block, size, frame.tsizes[i], frame.depth)
            node = self._nodes.get(cid)
            content = len(block) if node is None else node.filesize
            frame.i, frame.offset = i + 1, offset + content
            self._unref(cid)
            self._release(cid, block, frame.cid)
            if node is not None:
                self._emit(offset, memoryview(node.data), out)
            elif type(block) is _Leaf:
                self._emit(offset, block.view, out)
            else:
                self._emit(offset, memoryview(block), out)
            if node is not None and node.links:
                stack.append(_Frame(cid, node.links, node.sizes, node.tsizes, frame.depth + 1, offset + len(node.data)))
                for child in node.links:
                    self._refs[child] = self._refs.get(child, 0) + 1
        self.done = True
        self._held.clear()
        self._nodes.clear()
        self._asked.clear()
        return out

    def _emit(self, offset: int, data: memoryview, out: list[tuple[int, memoryview]]) -> None:
        lo = max(offset, self.start)
        hi = offset + len(data) if self.end is None else min(offset + len(data), self.end)
        if lo < hi:
            out.append((lo, data[lo - offset : hi - offset]))
            self.offset = hi

    def _unref(self, cid: Cid) -> None:
        left = self._refs.get(cid, 0) - 1
        if left > 0:
            self._refs[cid] = left
        else:
            self._refs.pop(cid, None)

    def _release(self, cid: Cid, block: Block | _Leaf, parent: Cid | None) -> None:
        """After a block was read under ``parent``: keep it if it may be read again, else drop it."""
        again = cid in self._refs or parent in self._kept
        if cid in self._kept:
            if again:
                self._kept[cid] = self._kept.pop(cid)  # most recently used last
            else:
                self._drop(cid)
            return
        cost = len(block) + _KEEP_COST
        if again and self._kept_bytes + cost > self._keep_limit:
            for old in [c for c in self._kept if c not in self._refs]:  # stale ones first, oldest first
                self._drop(old)
                if self._kept_bytes + cost <= self._keep_limit:
                    break
        if again and self._kept_bytes + cost <= self._keep_limit:
            self._kept[cid] = cost
            self._kept_bytes += cost
        else:
            self._drop(cid)

    def _drop(self, cid: Cid) -> None:
        self._kept_bytes -= self._kept.pop(cid, 0)
        self._held.pop(cid, None)
        self._nodes.pop(cid, None)


def walk(
    root: Cid | str,
    get_block: Callable[[Cid], Block],
    *,
    start: int = 0,
    end: int | None = None,
    verified: bool = False,
) -> Iterator[tuple[int, memoryview]]:
    """The bytes of a UnixFS file in order, as (offset, bytes) pieces, reading each block with
    ``get_block`` (a local blockstore, say) and checking it as ``Walker`` does (``verified``: the
    blocks were checked against their CIDs when stored; the structure is checked still)."""
    walker = Walker(root, start=start, end=end)
    while not walker.done:
        if walker.ready:
            yield from walker.advance()
        for cid in walker.wants(1):  # one block at a time: a local read needs no window
            yield from walker.add(cid, get_block(cid), verified=verified)
