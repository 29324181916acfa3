"""Arguments and results over the message cap travel by CID, as Ray's object store spills large
objects: when a call or its answer does not fit in one message (``MAX_MESSAGE``), its big buffers
(bytes, bytearrays, memoryviews, numpy arrays of ``SPILL_FROM`` bytes or more, inside lists,
tuples and dicts) are stored in the sender's content store and replaced by ``Spilled``
placeholders naming their CIDs; the receiver fetches them from the sender (verified block by
block against their CIDs) and puts the objects back before the method runs or the caller sees
the result. Bounded by the node's ``spill_limit`` (bytes of one message's spilled objects).

This module is the pure half: placeholders and walking values. The runtime stores and fetches."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from lattica import codec
from lattica.config import DEFAULT_SPILL_LIMIT
from lattica.errors import CodecError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["Spilled", "spill", "restore", "placeholders", "SPILL_FROM", "MAX_SPILLED", "DEFAULT_SPILL_LIMIT", "seen"]

SPILL_FROM = 1 << 20  # buffers smaller than this stay in the message
MAX_SPILLED = 64  # placeholders in one message
_MAX_DEPTH = 8  # containers walked into

seen = 0  # placeholders decoded so far (a decode that changes it holds some: checked per frame)


class Spilled:
    """An object left out of a message: the CID of its bytes and how to rebuild it."""

    __slots__ = ("cid", "kind", "dtype", "shape", "size")

    def __init__(self, cid: str, kind: str, size: int, dtype: str = "", shape: tuple[int, ...] = ()) -> None:
        self.cid = cid
        self.kind = kind  # "bytes", "bytearray" or "ndarray" (a memoryview comes back as bytes)
        self.size = size
        self.dtype = dtype
        self.shape = shape

    def __repr__(self) -> str:
        return f"Spilled({self.kind}, {self.size} bytes, {self.cid})"

    def rebuild(self, data: bytearray) -> Any:
        """The object from its bytes, taken over (ValueError when they do not fit what it said)."""
        if len(data) != self.size:
            raise ValueError(f"spilled {self.kind} {self.cid}: {len(data)} bytes, {self.size} announced")
        if self.kind == "bytes":
            return bytes(data)
        if self.kind == "bytearray":
            return data
        import numpy as np  # (an array was spilled: numpy is there)

        try:
            dt = np.dtype(self.dtype)
        except TypeError:  # (a peer named a dtype numpy does not know)
            raise ValueError(f"spilled array {self.cid}: dtype {self.dtype!r} is not one the codec carries") from None
        if dt.hasobject or dt.fields is not None or dt.kind not in "biufc":
            raise ValueError(f"spilled array {self.cid}: dtype {self.dtype!r} is not one the codec carries")
        count = 1
        for n in self.shape:
            count *= n
        if count * dt.itemsize != self.size:
            raise ValueError(f"spilled array {self.cid}: shape {self.shape} of {self.dtype} is not {self.size} bytes")
        return np.frombuffer(data, dtype=dt).reshape(self.shape)  # (writable: it owns the bytearray)


def _to_obj(s: Spilled) -> list:
    return [s.cid, s.kind, s.size, s.dtype, list(s.shape)]


def _from_obj(o: Any) -> Spilled:
    global seen
    if (
        type(o) is not list
        or len(o) != 5
        or type(o[0]) is not str
        or len(o[0]) > 128
        or o[1] not in ("bytes", "bytearray", "ndarray")
        or type(o[2]) is not int
        or o[2] < 0
        or type(o[3]) is not str
        or len(o[3]) > 16
        or type(o[4]) is not list
        or len(o[4]) > 32
        or not all(type(n) is int and n >= 0 for n in o[4])
    ):
        raise CodecError("malformed spilled value")
    seen += 1
    return Spilled(o[0], o[1], o[2], o[3], tuple(o[4]))


codec.register_ext(22, Spilled, _to_obj, _from_obj)


def _big(v: Any) -> tuple[str, bytes | memoryview, str, tuple[int, ...]] | None:
    """(kind, its bytes, dtype, shape) of a buffer worth spilling, else None."""
    t = type(v)
    if t is bytes or t is bytearray:
        return (t.__name__, v, "", ()) if len(v) >= SPILL_FROM else None
    if t is memoryview:
        return ("bytes", v.cast("B") if v.c_contiguous else v.tobytes(), "", ()) if v.nbytes >= SPILL_FROM else None
    if (
        t.__module__ == "numpy"
        and t.__name__ == "ndarray"
        and v.nbytes >= SPILL_FROM
        and v.dtype.kind in "biufc"
        and v.dtype.fields is None
    ):
        import numpy as np  # (v is an array: numpy is loaded)

        a = np.ascontiguousarray(v)
        # (an ndarray is a buffer; numpy declares its __buffer__ only for Python >= 3.12)
        return "ndarray", memoryview(cast("Buffer", a)).cast("B"), a.dtype.str, tuple(a.shape)
    return None


def _replace(value: Any, swap: Callable[[Any], Any], depth: int = 0) -> Any:
    """``value`` with each leaf ``swap`` changes (it returns the leaf itself to keep it) replaced,
    through lists, tuples and dicts down to _MAX_DEPTH: where spilling looks, and restoring."""
    new = swap(value)
    if new is not value or depth >= _MAX_DEPTH:
        return new
    t = type(value)
    if t is list:
        return [_replace(x, swap, depth + 1) for x in value]
    if t is tuple:
        return tuple(_replace(x, swap, depth + 1) for x in value)
    if t is dict:
        return {k: _replace(x, swap, depth + 1) for k, x in value.items()}
    return value


def spill(value: Any, put: Callable[[bytes | memoryview], str], limit: int) -> tuple[Any, list[str]]:
    """``value`` with its big buffers replaced by placeholders (``put`` stores one and names its
    CID), and the CIDs stored. CodecError when there is nothing to spill; values over ``limit``
    bytes (or more than MAX_SPILLED of them) raise ValueError naming the bound."""
    stored: list[str] = []
    total = 0

    def swap(v: Any) -> Any:
        nonlocal total
        big = _big(v)
        if big is None:
            return v
        kind, data, dtype, shape = big
        total += len(data)
        if total > limit:
            raise ValueError(f"the message's big values come to more than this node's spill_limit of {limit} bytes")
        if len(stored) >= MAX_SPILLED:
            raise ValueError(f"a message spills at most {MAX_SPILLED} values by CID")
        cid = put(data)
        stored.append(cid)
        return Spilled(cid, kind, len(data), dtype, shape)

    out = _replace(value, swap)
    if not stored:
        raise CodecError("nothing to spill")
    return out, stored


def placeholders(value: Any) -> list[Spilled]:
    """The placeholders in a decoded value (where ``spill`` puts them)."""
    found: list[Spilled] = []

    def note(v: Any) -> Any:
        if type(v) is Spilled:
            found.append(v)
        return v

    _replace(value, note)
    return found


def restore(value: Any, objects: dict[int, Any]) -> Any:
    """``value`` with each placeholder replaced by ``objects[id(placeholder)]``."""
    return _replace(value, lambda v: objects[id(v)] if type(v) is Spilled else v)
