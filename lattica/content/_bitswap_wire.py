"""Bitswap 1.2.0's messages (ipfs/specs ``bitswap-protocol.md``), sans-IO: bytes in, a checked
:class:`BitswapMessage` out, and back (issue 49).

``Message{wantlist = 1 (Wantlist{entries = 1 (Entry{block = 1, priority = 2, cancel = 3,
wantType = 4 (Block 0, Have 1), sendDontHave = 5}), full = 2}), blocks = 2 (1.0.0's, read as
raw-or-dag-pb payload we cannot type: ignored), payload = 3 (Block{prefix = 1, data = 2}),
blockPresences = 4 (BlockPresence{cid = 1, type = 2 (Have 0, DontHave 1)}), pendingBytes = 5}``,
each message a uvarint length and the protobuf, on a stream its **sender** opened. A block's CID
is rebuilt from its prefix and the data's hash, so a block always matches the CID we name it by;
whether we wanted it is the reader's business. What we read is bounded (4 MiB a message, 1,024
entries, presences or blocks); CIDs we cannot use (other codecs or hashes) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from lattica._protobuf import decode_fields, decode_repeated, encode_fields, read_uvarint, uvarint
from lattica.content._cid import DAG_PB, SHA2_256, Cid
from lattica.errors import InvalidCid, ProtocolError

__all__ = [
    "PROTOCOL",
    "MAX_MESSAGE",
    "Want",
    "V0",
    "Name",
    "cid_of",
    "BitswapMessage",
    "encode",
    "decode",
    "count_wants",
    "prefix_of",
]

PROTOCOL = "/ipfs/bitswap/1.2.0"
MAX_MESSAGE = 4 * 1024 * 1024 + 64 * 1024  # 4 MiB of blocks and the message around them
MAX_ITEMS = 1024  # entries, presences or blocks of one message we read
_DIGEST = 32


@dataclass(frozen=True, slots=True)
class Want:
    """A wantlist entry: ``have`` asks whether the peer holds the block (else it asks for the
    block), ``cancel`` withdraws an earlier want, ``send_dont_have`` asks for a DONT_HAVE rather
    than silence when the peer lacks it."""

    cid: Cid
    have: bool = False
    cancel: bool = False
    send_dont_have: bool = True
    priority: int = 1
    v0: bool = False  # the peer named it as a CIDv0 (``Qm...``): answers name it so too

    @property
    def name(self) -> Name:
        """What an answer to this want names: the CID as the peer wrote it."""
        return V0(self.cid) if self.v0 else self.cid


@dataclass(frozen=True, slots=True)
class V0:
    """A dag-pb CID to be written as a CIDv0 (a bare sha2-256 multihash), for a peer that named
    it so: go's Bitswap matches answers to wants by the exact CID, version included."""

    cid: Cid

    @property
    def bytes(self) -> bytes:
        return self.cid.bytes[-34:]


Name = Cid | V0


def cid_of(name: Name) -> Cid:
    """The CID a name stands for, however it is written."""
    return name.cid if isinstance(name, V0) else name


@dataclass(frozen=True, slots=True)
class BitswapMessage:
    wants: tuple[Want, ...] = ()
    full: bool = False
    blocks: tuple[tuple[Name, bytes], ...] = ()
    haves: tuple[Name, ...] = ()
    dont_haves: tuple[Name, ...] = ()


def prefix_of(name: Name) -> bytes:
    """The CID prefix a payload block carries: version, codec, multihash code and length."""
    version, cid = (0, name.cid) if isinstance(name, V0) else (1, name)
    return uvarint(version) + uvarint(cid.codec) + uvarint(SHA2_256) + uvarint(_DIGEST)


def encode(msg: BitswapMessage) -> bytes:
    """The protobuf message (without its length prefix)."""
    fields: list[tuple[int, int | bytes]] = []
    if msg.wants or msg.full:
        entries: list[tuple[int, int | bytes]] = []
        for w in msg.wants:
            entry: list[tuple[int, int | bytes]] = [(1, w.name.bytes), (2, w.priority)]
            if w.cancel:
                entry.append((3, 1))
            if w.have:
                entry.append((4, 1))
            if w.send_dont_have:
                entry.append((5, 1))
            entries.append((1, encode_fields(entry)))
        if msg.full:
            entries.append((2, 1))
        fields.append((1, encode_fields(entries)))
    for cid, data in msg.blocks:
        fields.append((3, encode_fields([(1, prefix_of(cid)), (2, data)])))
    for cid in msg.haves:
        fields.append((4, encode_fields([(1, cid.bytes), (2, 0)])))
    for cid in msg.dont_haves:
        fields.append((4, encode_fields([(1, cid.bytes), (2, 1)])))
    return encode_fields(fields)


def _cid_of_prefix(prefix: bytes, data: bytes) -> Cid:
    """The CID of ``data`` under a payload prefix; InvalidCid for one we cannot use."""
    version, pos = read_uvarint(prefix, 0)
    codec, pos = read_uvarint(prefix, pos)
    hash_code, pos = read_uvarint(prefix, pos)
    size, pos = read_uvarint(prefix, pos)
    if pos != len(prefix) or version not in (0, 1) or hash_code != SHA2_256 or size != _DIGEST:
        raise InvalidCid("a block prefix other than CIDv0/v1 over sha2-256")
    if version == 0 and codec != DAG_PB:
        raise InvalidCid("a CIDv0 prefix names dag-pb")
    return Cid.of(data, codec)


def count_wants(data: bytes) -> int:
    """How many wantlist entries a peer's message holds, counted without reading them (a peer's
    budget pays for its wants before they are parsed: parsing 1,024 takes milliseconds);
    ProtocolError if over the caps or malformed."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a Bitswap message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        lists = decode_repeated(data, 1)
        n = len(decode_repeated(lists[-1], 1)) if lists else 0
    except ValueError as e:
        raise ProtocolError(f"malformed Bitswap message: {e}") from None
    if n > MAX_ITEMS:
        raise ProtocolError(f"a Bitswap wantlist of {n} entries (at most {MAX_ITEMS})")
    return n


def decode(data: bytes, wants: bool = True, answers: bool = True) -> BitswapMessage:
    """A peer's message (its length prefix removed); ProtocolError if over the cap or malformed.
    Entries, presences and blocks with CIDs we cannot use are skipped; so are the wantlist's
    entries unless ``wants``, and blocks and presences unless ``answers`` (not parsed, not
    hashed: what nobody will use costs nothing)."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a Bitswap message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        fields = decode_fields(data)
        entries_read: list[Want] = []
        full = False
        raw_list = fields.get(1) if wants else None
        if raw_list is not None:
            if not isinstance(raw_list, bytes):
                raise ProtocolError("a Bitswap wantlist must be a message")
            full = bool(decode_fields(raw_list).get(2, 0))
            entries = decode_repeated(raw_list, 1)
            if len(entries) > MAX_ITEMS:
                raise ProtocolError(f"a Bitswap wantlist of {len(entries)} entries (at most {MAX_ITEMS})")
            for raw in entries:
                e = decode_fields(raw)
                block, priority = e.get(1), e.get(2, 1)
                if not isinstance(block, bytes) or not isinstance(priority, int):
                    raise ProtocolError("a Bitswap want names a CID")
                try:
                    cid = Cid.from_bytes(block)
                except InvalidCid:
                    continue
                v0 = len(block) == 34 and block[:2] == b"\x12\x20"  # (a bare multihash)
                entries_read.append(Want(cid, e.get(4, 0) == 1, bool(e.get(3, 0)), bool(e.get(5, 0)), priority, v0))
        blocks: list[tuple[Cid, bytes]] = []
        payload = decode_repeated(data, 3) if answers else []
        if len(payload) > MAX_ITEMS:
            raise ProtocolError(f"a Bitswap message of {len(payload)} blocks (at most {MAX_ITEMS})")
        for raw in payload:
            b = decode_fields(raw)
            prefix, block_data = b.get(1, b""), b.get(2, b"")
            if not isinstance(prefix, bytes) or not isinstance(block_data, bytes):
                raise ProtocolError("a Bitswap block is a prefix and data")
            try:
                blocks.append((_cid_of_prefix(prefix, block_data), block_data))
            except (InvalidCid, ValueError):
                continue
        haves: list[Cid] = []
        dont_haves: list[Cid] = []
        presences = decode_repeated(data, 4) if answers else []
        if len(presences) > MAX_ITEMS:
            raise ProtocolError(f"a Bitswap message of {len(presences)} presences (at most {MAX_ITEMS})")
        for raw in presences:
            p = decode_fields(raw)
            raw_cid, kind = p.get(1), p.get(2, 0)
            if not isinstance(raw_cid, bytes) or kind not in (0, 1):
                raise ProtocolError("a Bitswap presence is a CID and Have or DontHave")
            try:
                cid = Cid.from_bytes(raw_cid)
            except InvalidCid:
                continue
            (haves if kind == 0 else dont_haves).append(cid)
        return BitswapMessage(tuple(entries_read), full, tuple(blocks), tuple(haves), tuple(dont_haves))
    except ValueError as e:  # (the protobuf reader's: truncated, or a wire type Bitswap never uses)
        raise ProtocolError(f"malformed Bitswap message: {e}") from None
