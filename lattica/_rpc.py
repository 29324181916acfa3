"""The actor-call wire protocol (sans-IO): message shapes, validation, and frame splitting.

Calls travel on one long-lived stream per connection and direction (``/lattica/rpc/2``, or
``/lattica/rpc/1`` with a peer that does not serve it), opened by the calling side; replies come
back on the same stream. Every message is one codec frame preceded
by its 4-byte big-endian length. A message is a list whose first element is its kind:

caller → callee                                   callee → caller
  CALL   [0, id, actor, method, args, kwargs,       OK      [10, id, value]
          timeout, flags]                           ERR     [11, id, kind, type, message, tb]
  CANCEL [1, id]                                    ITEM    [12, id, value]
  CREDIT [2, id, n, taken]  (more result items)     END     [13, id]
  ARG    [3, id, index, value]  (client stream)     ARGCRED [14, id, index, n, taken]
  ARGEND [4, id, index]                             MAILBOX [15, actor, n]  (tell credit back)

A grant (CREDIT, ARGCRED) adds ``n`` items of credit, of which the consumer took ``taken`` (the
rest grew its window). ``taken`` is sent only on ``/lattica/rpc/2`` streams; a grant without it
means all ``n`` were taken (``/lattica/rpc/1``, where windows never grow).

Nothing here does I/O; ``FrameSplitter`` turns received bytes into frames, ``parse`` checks a
decoded message's shape so the runtime never indexes into garbage. A CALL we send is a
:class:`CallMsg`: the same list (the same bytes on the wire) with its fields readable by name;
the fields of the other messages are read with the index names below (``msg[VALUE]``).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from lattica.errors import FrameTooLarge, ProtocolError

PROTOCOL = "/lattica/rpc/2"  # grants say how many items were taken: stream windows may grow
PROTOCOL_1 = "/lattica/rpc/1"  # older peers: grants are all taken, windows stay at 16 items

CALL, CANCEL, CREDIT, ARG, ARGEND = 0, 1, 2, 3, 4
OK, ERR, ITEM, END, ARGCRED, MAILBOX = 10, 11, 12, 13, 14, 15

F_TELL = 1  # no reply wanted
F_STREAM = 2  # the method is a generator: reply with ITEMs and END, under CREDIT
F_ARGSTREAM = 4  # some arguments are streams, sent as ARG messages
# (8 was "the caller clamps streamed arguments' credit" in an unreleased version: ignored)

# ERR kinds
E_REMOTE = "remote"  # the method raised
E_NOT_FOUND = "not_found"
E_METHOD = "method"
E_TIMEOUT = "timeout"
E_DIED = "died"
E_MAILBOX = "mailbox"
E_SPAWN = "spawn"
E_CANCELLED = "cancelled"
E_PROTOCOL = "protocol"
E_DENIED = "denied"  # the caller may not call this (lattica.trust)

# where the fields of the other messages are: msg[ID] is every message's call id (but MAILBOX's)
ID = 1
VALUE = 2  # OK, ITEM: the value
ERR_KIND, ERR_TYPE, ERR_MESSAGE, ERR_TRACEBACK = 2, 3, 4, 5
CREDIT_N = 2  # CREDIT: how many more items (and, when present, msg[3]: how many of them were taken)
ARG_INDEX, ARG_ITEM, ARGCRED_N = 2, 3, 3
MAILBOX_ACTOR, MAILBOX_N = 1, 2

MAX_NAME = 256
_SHAPES: dict[int, int] = {
    CALL: 8,
    CANCEL: 2,
    CREDIT: 3,
    ARG: 4,
    ARGEND: 3,
    OK: 3,
    ERR: 6,
    ITEM: 3,
    END: 2,
    ARGCRED: 4,
    MAILBOX: 3,
}
_GRANT_N = {CREDIT: CREDIT_N, ARGCRED: ARGCRED_N}  # grants: where n is (``taken`` may follow it)


class CallMsg(list):
    """A CALL message: ``[CALL, id, actor, method, args, kwargs, timeout, flags]`` (encoded as that
    list, byte for byte) with its fields by name; the timeout can be rewritten before sending."""

    __slots__ = ()

    cid = property(itemgetter(1))
    actor = property(itemgetter(2))
    method = property(itemgetter(3))
    args = property(itemgetter(4))
    kwargs = property(itemgetter(5))
    timeout = property(itemgetter(6), lambda self, value: self.__setitem__(6, value))
    flags = property(itemgetter(7))


def call(
    cid: int, actor: str, method: str, args: list, kwargs: dict | None, timeout: float | None, flags: int
) -> CallMsg:
    return CallMsg((CALL, cid, actor, method, args, kwargs, timeout, flags))


def grant(msg: list) -> tuple[int, int]:
    """A parsed CREDIT's or ARGCRED's (credit, items taken): all of it taken when not said."""
    i = _GRANT_N[msg[0]]
    n = msg[i]
    return n, (msg[i + 1] if len(msg) > i + 1 else n)


def parse(msg: Any) -> list:
    """Check a decoded message's kind, length and field types; return it or raise ProtocolError."""
    if (type(msg) is not list and type(msg) is not CallMsg) or not msg:
        raise ProtocolError("rpc message must be a non-empty list")
    kind = msg[0]
    n = _SHAPES.get(kind) if type(kind) is int else None
    if n is not None and len(msg) == n + 1 and kind in _GRANT_N:
        n += 1  # a grant saying how much of it was taken
    if n is None or len(msg) != n:
        raise ProtocolError(f"rpc message of unknown kind or wrong length: kind {kind!r}, {len(msg)} fields")
    if kind == MAILBOX:
        if type(msg[1]) is not str or type(msg[2]) is not int or msg[2] < 0:
            raise ProtocolError("malformed MAILBOX credit")
        return msg
    if type(msg[1]) is not int or msg[1] < 0:
        raise ProtocolError("rpc message id must be a non-negative int")
    if kind == CALL:
        _, _, actor, method, args, kwargs, timeout, flags = msg
        if type(actor) is not str or type(method) is not str or len(actor) > MAX_NAME or len(method) > MAX_NAME:
            raise ProtocolError("CALL actor and method must be short strings")
        if type(args) is not list or (kwargs is not None and type(kwargs) is not dict):
            raise ProtocolError("CALL args must be a list and kwargs a map")
        if kwargs is not None and not all(type(k) is str for k in kwargs):
            raise ProtocolError("CALL keyword argument names must be strings")
        if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
            raise ProtocolError("CALL timeout must be a non-negative number")
        if type(flags) is not int:
            raise ProtocolError("CALL flags must be an int")
    elif kind in (CREDIT, ARGCRED):
        grant = msg[_GRANT_N[kind]]
        if type(grant) is not int or grant < 1:
            raise ProtocolError("credit must be a positive int")
        if len(msg) > _GRANT_N[kind] + 1 and (type(msg[-1]) is not int or not 0 <= msg[-1] <= grant):
            raise ProtocolError("a grant's items taken must be an int from 0 to its credit")
    elif kind == ERR:
        if not all(type(x) is str for x in msg[2:]):
            raise ProtocolError("ERR fields must be strings")
    if kind in (ARG, ARGEND, ARGCRED) and (type(msg[2]) is not int or msg[2] < 0):
        raise ProtocolError("stream argument index must be a non-negative int")
    return msg


class FrameSplitter:
    """Splits stream bytes into complete length-prefixed frames (each at most ``max_frame``).

    Frames inside one read come out as zero-copy slices; a frame spread over several reads is
    collected as a list of pieces and joined once, when its last byte arrives.
    """

    __slots__ = ("_parts", "_have", "_need", "_max")

    def __init__(self, max_frame: int) -> None:
        self._parts: list[bytes | memoryview] = []  # an incomplete frame (or length prefix)
        self._have = 0
        self._need = 0  # bytes of the current frame including its prefix, once known
        self._max = max_frame

    @property
    def held(self) -> int:
        """Bytes of an incomplete frame held until its last byte arrives."""
        return self._have

    @property
    def declared(self) -> int:
        """The length the incomplete frame declared (0 until its length prefix is in)."""
        return max(self._need - 4, 0)

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """Frames completed by ``data``. Raises FrameTooLarge when a declared length exceeds the cap."""
        frames: list[bytes | memoryview] = []
        view = memoryview(data)
        if self._parts:
            rest = self._continue(view, frames)
            if rest is None:
                return frames
            view = rest
        total = len(view)
        pos = 0
        while total - pos >= 4:
            n = int.from_bytes(view[pos : pos + 4], "big")
            if n > self._max:
                raise FrameTooLarge(f"rpc message of {n} bytes exceeds the limit of {self._max}")
            if total - pos - 4 < n:
                break
            frames.append(view[pos + 4 : pos + 4 + n])
            pos += 4 + n
        if pos < total:
            rest = view[pos:]
            if len(rest) * 2 < total:  # a short tail: a copy, or it would pin the whole read
                rest = memoryview(bytes(rest))
            self._parts = [rest]
            self._have = len(rest)
            self._need = 4 + int.from_bytes(rest[:4], "big") if len(rest) >= 4 else 0
            if self._need > 4 + self._max:
                raise FrameTooLarge(f"rpc message of {self._need - 4} bytes exceeds the limit of {self._max}")
        return frames

    def _continue(self, view: memoryview, frames: list) -> memoryview | None:
        """Add ``view`` to the incomplete frame; return what is left of it after that frame."""
        if not self._need:  # the length prefix itself was split
            head = b"".join(self._parts) + bytes(view[: 4 - self._have])
            if len(head) < 4:
                self._parts, self._have = [head], len(head)
                return None
            self._need = 4 + int.from_bytes(head[:4], "big")
            if self._need > 4 + self._max:
                raise FrameTooLarge(f"rpc message of {self._need - 4} bytes exceeds the limit of {self._max}")
        missing = self._need - self._have
        if len(view) < missing:
            self._parts.append(view)
            self._have += len(view)
            return None
        self._parts.append(view[:missing])
        frames.append(memoryview(b"".join(self._parts))[4:])
        self._parts, self._have, self._need = [], 0, 0
        return view[missing:]
