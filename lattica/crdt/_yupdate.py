"""Read what a Yjs update (encoding v1, what pycrdt/yrs and Yjs write) creates and deletes,
without applying it: the new items' client ids and clock ranges, and the delete set.

A replica checks these before an update touches its document: an author may create items only
under the client id bound to it, starting exactly where that client's clock stands, and may
delete only items that already exist where it made the change (docs/crdt.md). Yjs would accept
anything: an update under another writer's client id and clocks silently wins over the victim's
real one, and a delete of clocks not yet written removes them the moment they arrive.

The reader is strict, and narrower than Yjs: it takes what pycrdt's maps, arrays, texts and XML
fragments write in a transaction, and refuses the rest (skip structs, items of no length, JSON and
sub-document content, XML hooks, clocks or lengths beyond yrs's 32 bits, clients beyond 53 bits, varints not
in their shortest form, parent flags other than 0 and 1, nesting deeper than :data:`MAX_DEPTH`,
repeated clients, bytes left over: :class:`lattica.errors.MalformedUpdate`). And because what
counts is how **yrs** reads the bytes, :func:`read_update_as_yrs` also has yrs re-encode the
update and refuses it unless that reads the same: no byte string can mean one thing here and
another to the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lattica.errors import MalformedUpdate

__all__ = [
    "UpdateInfo",
    "read_update",
    "read_update_as_yrs",
    "read_state_vector",
    "write_state_vector",
    "MAX_DEPTH",
    "MAX_CLOCK",
    "MAX_CLIENT",
]

MAX_DEPTH = 32  # nesting of lists and maps inside one value
MAX_CLOCK = (1 << 32) - 1  # yrs's clocks and lengths are 32-bit
MAX_CLIENT = (1 << 53) - 1  # client ids stay within JavaScript's safe integers

_GC, _DELETED, _JSON, _BINARY, _STRING, _EMBED, _FORMAT, _TYPE, _ANY, _DOC, _SKIP = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
_XML_ELEMENT = 3  # the one type ref followed by a name (an XML hook, 5, is refused: yrs reads no name after it)
_KNOWN_TYPE_REFS = frozenset({0, 1, 2, 3, 4, 6})  # array, map, text, xml element/fragment/text (no hooks)


@dataclass
class UpdateInfo:
    """What one update holds: for each client, the clock range ``[start, end)`` of the items it
    creates (GC structs count; skips are refused), and the ``(client, clock, length)`` ranges it
    deletes."""

    structs: dict[int, tuple[int, int]] = field(default_factory=dict)
    deletes: list[tuple[int, int, int]] = field(default_factory=list)
    roots: dict[str, str] = field(default_factory=dict)  # root types it writes into directly: "map", "text" or "array"
    # per client, the clock a document must have reached for the update to apply without waiting:
    # one past every item it names (origins, parents) or deletes
    needs: dict[int, int] = field(default_factory=dict)

    def need(self, client: int, clock: int) -> None:
        if self.needs.get(client, 0) < clock:
            self.needs[client] = clock


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

    def uint(self, limit: int = MAX_CLOCK) -> int:
        """A varint in its shortest form, at most ``limit``."""
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
                if b == 0 and shift:
                    raise MalformedUpdate("a number in the update is not in its shortest form")
                if n > limit:
                    raise MalformedUpdate(f"a number in the update is over {limit}")
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
            return self.buf[start : self.pos].decode("utf-8")
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
        ref = r.byte()  # (one byte in yrs)
        if ref not in _KNOWN_TYPE_REFS:
            raise MalformedUpdate(f"shared type {ref} is not taken in an update")
        if ref == _XML_ELEMENT:
            r.string()
        return 1
    if kind == _ANY:
        n = r.uint()
        for _ in range(n):
            r.any()
        return n
    raise MalformedUpdate(f"content kind {kind} is not taken in an update")


def read_update(update: bytes) -> UpdateInfo:
    """What ``update`` creates, names and deletes (see :class:`UpdateInfo`), as this reader
    reads it; MalformedUpdate if it is not an update we take (see the module docstring)."""
    r = _Reader(bytes(update))
    info = UpdateInfo()
    for _ in range(r.uint()):
        count, client, clock = r.uint(), r.uint(MAX_CLIENT), r.uint()
        if client in info.structs:
            raise MalformedUpdate(f"client {client} appears twice in the update")
        start = clock
        for _ in range(count):
            b = r.byte()
            kind = b & 0x1F
            if b == _GC:  # (exactly 0, as yrs matches it: content created and deleted in one transaction)
                length = r.uint()
                if not length:
                    raise MalformedUpdate("a GC struct of no length")
                clock += length
                if clock > MAX_CLOCK:
                    raise MalformedUpdate(f"the update's clocks go past {MAX_CLOCK}")
                continue
            if kind in (_GC, _SKIP, _JSON, _DOC) or kind > _SKIP:
                raise MalformedUpdate(f"struct kind {b} is not taken in an update")
            if b & 0x80:  # left origin
                c, k = r.uint(MAX_CLIENT), r.uint()
                info.need(c, k + 1)
            if b & 0x40:  # right origin
                c, k = r.uint(MAX_CLIENT), r.uint()
                info.need(c, k + 1)
            root = None
            if not b & 0xC0:  # no origin to copy the parent from
                flag = r.uint()
                if flag == 1:
                    root = r.string()
                elif flag == 0:
                    c, k = r.uint(MAX_CLIENT), r.uint()
                    info.need(c, k + 1)
                else:
                    raise MalformedUpdate("an item's parent flag is 0 or 1")
                if b & 0x20:
                    r.string()
                    if root is not None:
                        info.roots[root] = "map"
                        root = None
            length = _content_length(r, kind)
            if not length:  # (yrs drops such items, and with them what they name)
                raise MalformedUpdate("an item of no length")
            if root is not None:
                if kind in (_STRING, _FORMAT, _EMBED):
                    info.roots[root] = "text"
                elif kind != _DELETED:
                    info.roots.setdefault(root, "array")
            clock += length
            if clock > MAX_CLOCK:
                raise MalformedUpdate(f"the update's clocks go past {MAX_CLOCK}")
        if count:
            info.structs[client] = (start, clock)
    for _ in range(r.uint()):
        client = r.uint(MAX_CLIENT)
        for _ in range(r.uint()):
            clock, length = r.uint(), r.uint()
            if clock + length > MAX_CLOCK:
                raise MalformedUpdate(f"the update deletes clocks past {MAX_CLOCK}")
            if length:
                info.deletes.append((client, clock, length))
                info.need(client, clock + length)
    if r.pos != len(r.buf):
        raise MalformedUpdate(f"{len(r.buf) - r.pos} bytes follow the update")
    return info


def read_update_as_yrs(update: bytes) -> UpdateInfo:
    """:func:`read_update`, refused unless yrs reads the update the same way: yrs decodes it and
    writes it again (pycrdt's ``merge_updates``), and that must create and delete exactly what
    this reader found."""
    info = read_update(update)
    import pycrdt  # (loaded with the first document anyway)

    try:
        again = pycrdt.merge_updates(bytes(update))
    except BaseException as exc:  # yrs panics are BaseExceptions
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise MalformedUpdate(f"yrs cannot read the update: {exc}") from None
    try:
        theirs = read_update(again)
    except MalformedUpdate:
        raise MalformedUpdate("yrs reads the update differently") from None
    if theirs.structs != info.structs or _ranges(theirs.deletes) != _ranges(info.deletes) or theirs.needs != info.needs:
        raise MalformedUpdate("yrs reads the update differently")
    return info


def _ranges(deletes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Delete ranges sorted, with overlapping or touching ones of a client merged."""
    out: list[list[int]] = []
    for c, k, n in sorted(deletes):
        if out and out[-1][0] == c and k <= out[-1][1] + out[-1][2]:
            out[-1][2] = max(out[-1][2], k + n - out[-1][1])
        else:
            out.append([c, k, n])
    return [tuple(x) for x in out]  # type: ignore[misc]


def read_state_vector(sv: bytes) -> dict[int, int]:
    """A state vector (``Doc.get_state()``) as ``{client: clock}``."""
    r = _Reader(bytes(sv))
    out = {r.uint(MAX_CLIENT): r.uint() for _ in range(r.uint())}
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
