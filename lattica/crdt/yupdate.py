"""Read what a Yjs update (encoding v1, what pycrdt/yrs and Yjs write) creates and deletes,
without applying it: the new items' client ids and clock ranges, and the delete set.

A replica checks these before an update touches its document: an author may create items only
under the client id bound to it, starting exactly where that client's clock stands, and may
delete only items that already exist where it made the change (docs/crdt.md). Yjs would accept
anything: an update under another writer's client id and clocks silently wins over the victim's
real one, and a delete of clocks not yet written removes them the moment they arrive.

The reader is strict: unknown struct or content kinds, repeated clients, nesting deeper than
:data:`MAX_DEPTH` or bytes left over are refused (:class:`lattica.errors.MalformedUpdate`).
"""

from __future__ import annotations

import struct as _struct
from dataclasses import dataclass, field

from lattica.errors import MalformedUpdate

__all__ = ["UpdateInfo", "read_update", "read_state_vector", "write_state_vector", "MAX_DEPTH"]

MAX_DEPTH = 32  # nesting of lists and maps inside one value

_GC, _DELETED, _JSON, _BINARY, _STRING, _EMBED, _FORMAT, _TYPE, _ANY, _DOC, _SKIP = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
_XML_ELEMENT, _XML_HOOK = 3, 5  # type refs followed by a name
_KNOWN_TYPE_REFS = frozenset({0, 1, 2, 3, 4, 5, 6})  # array, map, text, xml element/fragment/hook/text


@dataclass
class UpdateInfo:
    """What one update holds: for each client, the clock range ``[start, end)`` of the items it
    creates (GC structs count; skips are refused), and the ``(client, clock, length)`` ranges it
    deletes."""

    structs: dict[int, tuple[int, int]] = field(default_factory=dict)
    deletes: list[tuple[int, int, int]] = field(default_factory=list)
    roots: dict[str, str] = field(default_factory=dict)  # root types it writes into directly: "map", "text" or "array"


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def byte(self) -> int:
        try:
            b = self.buf[self.pos]
        except IndexError:
            raise MalformedUpdate("the update ends early") from None
        self.pos += 1
        return b

    def uint(self) -> int:
        n = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            try:
                b = buf[pos]
            except IndexError:
                raise MalformedUpdate("the update ends inside a number") from None
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return n
            shift += 7
            if shift > 63:
                raise MalformedUpdate("a number in the update is longer than 64 bits")

    def sint(self) -> None:
        b = self.byte()
        shift = 6
        while b & 0x80:
            b = self.byte()
            shift += 7
            if shift > 70:
                raise MalformedUpdate("a number in the update is longer than 64 bits")

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise MalformedUpdate("the update ends inside a value")
        self.pos += n

    def string(self) -> str:
        n = self.uint()
        start = self.pos
        self.skip(n)
        try:
            return self.buf[start:self.pos].decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedUpdate("a string in the update is not UTF-8") from None

    def any(self, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise MalformedUpdate(f"a value in the update nests deeper than {MAX_DEPTH}")
        t = self.byte()
        if t in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if t == 125:
            self.sint()
        elif t == 124:
            self.skip(4)
        elif t in (123, 122):
            self.skip(8)
        elif t == 119:
            self.string()
        elif t == 118:
            for _ in range(self.uint()):
                self.string()
                self.any(depth + 1)
        elif t == 117:
            for _ in range(self.uint()):
                self.any(depth + 1)
        elif t == 116:
            self.skip(self.uint())
        else:
            raise MalformedUpdate(f"unknown value type {t} in the update")


def _utf16_len(s: str) -> int:
    n = len(s)
    if s.isascii():
        return n
    return n + sum(1 for ch in s if ord(ch) > 0xFFFF)


def _content_length(r: _Reader, kind: int) -> int:
    """Read one item's content; its length in clock ticks."""
    if kind == _DELETED:
        return r.uint()
    if kind == _JSON:
        n = r.uint()
        for _ in range(n):
            r.string()
        return n
    if kind == _BINARY:
        r.skip(r.uint())
        return 1
    if kind == _STRING:
        return _utf16_len(r.string())
    if kind == _EMBED:
        r.string()
        return 1
    if kind == _FORMAT:
        r.string()
        r.string()
        return 1
    if kind == _TYPE:
        ref = r.uint()
        if ref not in _KNOWN_TYPE_REFS:
            raise MalformedUpdate(f"unknown shared type {ref} in the update")
        if ref in (_XML_ELEMENT, _XML_HOOK):
            r.string()
        return 1
    if kind == _ANY:
        n = r.uint()
        for _ in range(n):
            r.any()
        return n
    if kind == _DOC:
        r.string()
        r.any()
        return 1
    raise MalformedUpdate(f"unknown content kind {kind} in the update")


def read_update(update: bytes) -> UpdateInfo:
    """What ``update`` creates and deletes (see :class:`UpdateInfo`); MalformedUpdate if it is
    not a well-formed v1 update."""
    r = _Reader(bytes(update))
    info = UpdateInfo()
    for _ in range(r.uint()):
        count, client, clock = r.uint(), r.uint(), r.uint()
        if client in info.structs:
            raise MalformedUpdate(f"client {client} appears twice in the update")
        start = clock
        for _ in range(count):
            b = r.byte()
            kind = b & 0x1F
            if kind == _GC:
                length = r.uint()
            elif kind == _SKIP:
                raise MalformedUpdate("the update has a gap (a skip struct)")
            else:
                if b & 0x80:  # left origin
                    r.uint(), r.uint()
                if b & 0x40:  # right origin
                    r.uint(), r.uint()
                root = None
                if not b & 0xC0:  # no origin to copy the parent from
                    if r.uint() == 1:
                        root = r.string()
                    else:
                        r.uint(), r.uint()
                    if b & 0x20:
                        r.string()
                        if root is not None:
                            info.roots[root] = "map"
                            root = None
                length = _content_length(r, kind)
                if root is not None:
                    if kind in (_STRING, _FORMAT, _EMBED):
                        info.roots[root] = "text"
                    elif kind != _DELETED:
                        info.roots.setdefault(root, "array")
            clock += length
        if count:
            info.structs[client] = (start, clock)
    for _ in range(r.uint()):
        client = r.uint()
        for _ in range(r.uint()):
            clock, length = r.uint(), r.uint()
            if length:
                info.deletes.append((client, clock, length))
    if r.pos != len(r.buf):
        raise MalformedUpdate(f"{len(r.buf) - r.pos} bytes follow the update")
    return info


def read_state_vector(sv: bytes) -> dict[int, int]:
    """A state vector (``Doc.get_state()``) as ``{client: clock}``."""
    r = _Reader(bytes(sv))
    out = {r.uint(): r.uint() for _ in range(r.uint())}
    if r.pos != len(r.buf):
        raise MalformedUpdate("bytes follow the state vector")
    return out


def write_state_vector(clocks: dict[int, int]) -> bytes:
    """The encoded state vector of ``{client: clock}`` (what ``Doc.get_update`` takes)."""
    out = bytearray()
    for n in (len(clocks), *(x for kv in clocks.items() for x in kv)):
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)
