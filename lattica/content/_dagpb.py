"""The dag-pb codec (IPLD PBNode/PBLink protobuf): UnixFS nodes travel in it.

Encoding writes the canonical form; decoding accepts only the canonical form and refuses
anything else with BadBlock, because these bytes come from the network and a lenient reader is
an attack surface (and two readings of one block must never differ).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

from lattica._protobuf import uvarint
from lattica.content._cid import Cid
from lattica.errors import BadBlock, InvalidCid

__all__ = ["PBLink", "PBNode", "encode", "decode", "read_varint", "MAX_LINKS", "MAX_BLOCK"]

MAX_LINKS: Final = 174
"""The most links a node may have: the fan-out of the IPFS balanced file layout."""

MAX_BLOCK: Final = 2 * 1024 * 1024 + 16 * 1024
"""The largest block we read or write: a 2 MiB chunk plus room for a node's own encoding.

A File node carrying a full 2 MiB chunk inline with 174 links needs under 12 KiB besides the
chunk (174 links of at most 53 bytes with empty names, 174 blocksizes of at most 11 bytes, a few
header fields), so 16 KiB of room admits every node a UnixFS importer makes and little more."""

_MAX_U64: Final = (1 << 64) - 1
_TAG_HASH: Final = 0x0A  # PBLink.Hash = 1, length-delimited
_TAG_NAME: Final = 0x12  # PBLink.Name = 2, length-delimited
_TAG_TSIZE: Final = 0x18  # PBLink.Tsize = 3, varint
_TAG_DATA: Final = 0x0A  # PBNode.Data = 1, length-delimited
_TAG_LINK: Final = 0x12  # PBNode.Links = 2, length-delimited
_WIRE_NAMES: Final = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group start", 4: "group end", 5: "32-bit"}


class PBLink(NamedTuple):
    """A link: the CID it points to, its name (None when absent) and Tsize (None when absent)."""

    cid: Cid
    name: str | None = None
    tsize: int | None = None


class PBNode(NamedTuple):
    """A decoded node: its links in block order, and its Data (None when the field is absent)."""

    links: list[PBLink]
    data: bytes | None


def read_varint(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    """The strict protobuf varint at ``pos`` and the position after it.

    BadBlock (naming ``what``) if it is truncated, longer than 10 bytes, not minimally encoded
    (a redundant trailing zero group) or above 2**64 - 1."""
    if pos < len(buf) and buf[pos] < 0x80:
        return buf[pos], pos + 1
    n = shift = 0
    for i in range(10):
        if pos + i >= len(buf):
            raise BadBlock(f"truncated varint in {what}")
        b = buf[pos + i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0:
                raise BadBlock(f"non-minimal varint in {what}")
            if n > _MAX_U64:
                raise BadBlock(f"varint in {what} exceeds 64 bits")
            return n, pos + i + 1
        shift += 7
    raise BadBlock(f"varint in {what} is longer than 10 bytes")


def _wire(tag: int) -> str:
    return _WIRE_NAMES.get(tag & 7, f"wire type {tag & 7}")


def _field(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """The (start, end) of a length-delimited field's body whose length varint is at ``pos``."""
    length, pos = read_varint(buf, pos, what)
    if length > end - pos:
        raise BadBlock(f"truncated {what}: {length} bytes announced, {end - pos} left")
    return pos, pos + length


def encode(links: Iterable[PBLink | tuple], data: bytes | bytearray | memoryview | None = None) -> bytes:
    """The canonical dag-pb block for ``links`` (``(cid, name, tsize)``; name and tsize may be
    None to leave the field out) and ``data`` (None leaves the Data field out; b"" writes it empty).

    Links are sorted by the UTF-8 bytes of their names, keeping the given order among equal names
    (a file's links all have empty names, so their order is kept), and written before Data, each
    with Hash, Name, Tsize in that order. ValueError if a value cannot be encoded, the node has
    more than MAX_LINKS links, or the block would exceed MAX_BLOCK."""
    prepared = []
    for link in links:
        cid, name, tsize = PBLink(*link)
        if not isinstance(cid, Cid):
            raise ValueError(f"a link's target is a Cid, not {type(cid).__name__}")
        raw_name = None if name is None else name.encode("utf-8")
        if tsize is not None and not (isinstance(tsize, int) and 0 <= tsize <= _MAX_U64):
            raise ValueError(f"a link's Tsize is an integer in 0..2**64-1, not {tsize!r}")
        prepared.append((b"" if raw_name is None else raw_name, cid, raw_name, tsize))
    if len(prepared) > MAX_LINKS:
        raise ValueError(f"a dag-pb node has at most {MAX_LINKS} links, not {len(prepared)}")
    prepared.sort(key=lambda p: p[0])
    out = bytearray()
    for _, cid, raw_name, tsize in prepared:
        h = cid.bytes
        body = bytearray((_TAG_HASH, len(h)))
        body += h
        if raw_name is not None:
            body.append(_TAG_NAME)
            body += uvarint(len(raw_name))
            body += raw_name
        if tsize is not None:
            body.append(_TAG_TSIZE)
            body += uvarint(tsize)
        out.append(_TAG_LINK)
        out += uvarint(len(body))
        out += body
    if data is not None:
        out.append(_TAG_DATA)
        out += uvarint(len(data))
        out += data
    if len(out) > MAX_BLOCK:
        raise ValueError(f"the dag-pb block would have {len(out)} bytes, over the {MAX_BLOCK}-byte limit")
    return bytes(out)


def _decode_link(buf: bytes, index: int) -> PBLink:
    """One link from ``buf``, which holds exactly its encoding (so no field can reach past it)."""
    what = f"PBLink {index}"
    pos, end = 0, len(buf)
    cid: Cid | None = None
    name: str | None = None
    tsize: int | None = None
    last = 0  # the last field number seen: fields must come in increasing order, each at most once
    while pos < end:
        tag, pos = read_varint(buf, pos, f"{what} field tag")
        number = tag >> 3
        if number not in (1, 2, 3):
            raise BadBlock(f"{what}: unknown field {number} (a link has only Hash=1, Name=2, Tsize=3)")
        if number == last:
            raise BadBlock(f"{what}: field {number} is repeated")
        if number < last:
            raise BadBlock(f"{what}: field {number} after field {last} (canonical order is Hash, Name, Tsize)")
        last = number
        if number == 3:
            if tag != _TAG_TSIZE:
                raise BadBlock(f"{what}: Tsize has {_wire(tag)} wire type, not varint")
            tsize, pos = read_varint(buf, pos, f"{what} Tsize")
            continue
        if tag & 7 != 2:
            raise BadBlock(f"{what}: field {number} has {_wire(tag)} wire type, not length-delimited")
        start, pos = _field(buf, pos, end, f"{what} field {number}")
        if number == 1:
            try:
                cid = Cid.from_bytes(buf[start:pos])
            except InvalidCid as e:
                raise BadBlock(f"{what}: Hash is not a CID we support: {e}") from None
        else:
            try:
                name = buf[start:pos].decode("utf-8")
            except UnicodeDecodeError:
                raise BadBlock(f"{what}: Name is not UTF-8") from None
    if cid is None:
        raise BadBlock(f"{what} has no Hash")
    return PBLink(cid, name, tsize)


def decode(block: bytes | bytearray | memoryview) -> PBNode:
    """Decode a dag-pb block strictly; BadBlock (saying what is wrong) unless it is canonical.

    Refused: blocks over MAX_BLOCK, more than MAX_LINKS links, fields other than PBNode.Links=2 /
    Data=1 and PBLink.Hash=1 / Name=2 / Tsize=3, wrong wire types, a repeated Data or link field,
    link fields out of order, Data before a link (the canonical form writes Links first; the spec
    lets readers accept the reverse, which we do not), non-minimal or over-long varints, truncated
    fields, names that are not UTF-8, and links without a Hash or whose Hash is not a CID we
    support (CIDv1/CIDv0, raw or dag-pb, sha2-256)."""
    if len(block) > MAX_BLOCK:
        raise BadBlock(f"a dag-pb block of {len(block)} bytes is over the {MAX_BLOCK}-byte limit")
    buf = block if isinstance(block, bytes) else bytes(block)
    end = len(buf)
    links: list[PBLink] = []
    data: bytes | None = None
    pos = 0
    while pos < end:
        tag, pos = read_varint(buf, pos, "PBNode field tag")
        if tag == _TAG_LINK:
            if data is not None:
                raise BadBlock("PBNode: a link after Data (the canonical form writes all Links first)")
            if len(links) == MAX_LINKS:
                raise BadBlock(f"PBNode has more than {MAX_LINKS} links")
            start, pos = _field(buf, pos, end, f"PBLink {len(links)}")
            links.append(_decode_link(buf[start:pos], len(links)))
        elif tag == _TAG_DATA:
            if data is not None:
                raise BadBlock("PBNode: Data is repeated")
            start, pos = _field(buf, pos, end, "PBNode Data")
            data = buf[start:pos]
        elif tag >> 3 in (1, 2):
            raise BadBlock(f"PBNode: field {tag >> 3} has {_wire(tag)} wire type, not length-delimited")
        else:
            raise BadBlock(f"PBNode: unknown field {tag >> 3} (a node has only Data=1 and Links=2)")
    return PBNode(links, data)
