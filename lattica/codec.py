"""Message codec: msgpack envelopes with out-of-band buffers (the hot path of every RPC).

A *frame* is one encoded message. Large binary payloads (numpy arrays and bytes-likes of at least
``Limits.oob_threshold`` bytes) are not copied into the msgpack body: they follow it as separate
buffers, are handed to the transport as-is, and decode zero-copy as slices of the received frame.
Only plain data is ever decoded (no object serializer, no code); every length is checked against
``Limits`` before anything is allocated.

Wire format, version 1 (all integers little-endian)::

    frame   = header body [pad buffer]*          total length known from the transport framing
    header  = u8 version (=1) | u8 flags | u16 nbuf | u32 body_len | nbuf * u64 buffer_len
    flags   = bit 0: the body holds tuples (arrays whose first item is ext 3); other bits 0
    body    = one msgpack object of body_len bytes
    pad     = 0..7 zero bytes so that every buffer starts at a multiple of 8 from the frame start

    msgpack extension types inside the body (codes 0..15 belong to the codec):
      0  out-of-band bytes   u32 buffer index                    -> memoryview slice of the frame
      1  numpy array         u8 ndim | u8 dtype_len | u16 0 | u32 buffer index (0xFFFFFFFF = inline)
                             | ndim * u64 shape | dtype str (e.g. "<f4") NUL-padded to 8 bytes
                             | inline data (C order)           -> np.frombuffer view, no copy
      2  numpy scalar        u8 dtype_len | dtype str | itemsize raw bytes
      3  tuple marker        empty; the first item of an array that decodes as a tuple
      16..63                 lattica types registered with register_ext (16 PeerId, 17 Multiaddr)
      64..127                free for applications (register_ext)
      registered payload     = a nested msgpack object (it may itself reference buffers); nested
                               registered types at most 8 levels deep

Tuples (and their subclasses, such as named tuples) decode as tuples: an array whose first item is
the tuple marker, allowed only in a frame whose header says it holds tuples (so frames without
any decode without a hook per array). Common Python values (sets, datetimes, UUIDs, decimals,
paths) and registered dataclasses and enums travel as extensions (``lattica.values``). Map keys are encoded only when
they are str, int, bytes or a registered extension type. Floats are float64; ints must fit
msgpack's range (-2**63 .. 2**64-1). msgpack's reserved timestamp extension (-1), which this codec
never emits, decodes to int nanoseconds. Arrays use a fixed allow-list of bool/int/uint/float/
complex dtypes in either byte order; object, string, structured and datetime dtypes are refused.
"""

from __future__ import annotations

import gc
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np

import msgpack

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import CodecError, FrameTooLarge

__all__ = ["Limits", "DEFAULT_LIMITS", "check", "encode", "encode_bytes", "decode", "register_ext", "register_encoder"]


@dataclass(frozen=True)
class Limits:
    """Hard caps applied to every frame (checked before allocating), and the out-of-band cutoff."""

    max_frame: int = 64 * 1024 * 1024 + 1024  # whole encoded frame, bytes
    max_depth: int = 32  # nesting depth of containers (per extension payload)
    max_items: int = 1_000_000  # length of any single list / map
    max_containers: int = (
        1_000_000  # lists and maps in one frame, an extension value counting as 8 (in bodies over 64 KiB)
    )
    max_buffers: int = 1024  # out-of-band buffers per frame
    max_str: int = 16 * 1024 * 1024  # bytes per str / bin / ext in the msgpack body
    oob_threshold: int = 64 * 1024  # bytes-likes and arrays at least this big go out of band
    _floor: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_frame", "max_depth", "max_items", "max_containers", "max_str", "oob_threshold"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"Limits.{name} must be a non-negative int")
        if not 0 <= self.max_buffers <= 0xFFFF:
            raise ValueError("Limits.max_buffers must be in 0..65535")
        object.__setattr__(self, "_floor", min(self.max_items, self.max_str))


DEFAULT_LIMITS = Limits()

# -- constants -------------------------------------------------------------------------------------

_VERSION = 1
_HDR = struct.Struct("<BBHI")
_U32 = struct.Struct("<I")
_ARR = struct.Struct("<BBHI")
_INLINE = 0xFFFFFFFF
_MAX_NDIM = 32
# Structured extension payloads are decoded by a nested msgpack call that puts ~40 KiB of decoder
# state on the C stack, so their nesting has a fixed cap whatever Limits.max_depth says.
_MAX_EXT_NESTING = 8
_PAD = [b"\0" * i for i in range(8)]

_EXT_OOB, _EXT_ARRAY, _EXT_SCALAR, _EXT_TUPLE = 0, 1, 2, 3
_FLAG_TUPLES = 1  # header flag: the body holds tuple markers
_RESERVED_CODES = range(16)

_LEAF: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_SKIP: set[type] = {*_LEAF, msgpack.ExtType}  # values the walk need not enter (+ ndarray, registered classes)
_BIN8 = [b"\xc4" + bytes((i,)) for i in range(256)]  # msgpack bin 8 headers
_ext = tuple.__new__  # _ext(ExtType, (code, data)) skips ExtType's slow argument checks
_TUPLE_MARK = _ext(msgpack.ExtType, (_EXT_TUPLE, b""))
_BYTES_LIKE = (bytes, bytearray, memoryview)
_CONTAINERS = frozenset({list, dict, tuple})  # what msgpack decodes arrays and maps to (and tuples)


class _TupleMark:
    """What a tuple marker decodes to before its array becomes a tuple (inert if found elsewhere)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<lattica tuple marker>"


_TUPLE_SENTINEL = _TupleMark()

_DTYPES_DEC: dict[bytes, np.dtype] = {}
_DTYPES_ENC: dict[str, bytes] = {}
_numpy_module: Any = None


def _numpy() -> Any:
    """numpy, imported on first use: a node that never sees an array never pays its import."""
    global _numpy_module
    if _numpy_module is None:
        import numpy  # on first use: a node that never sees an array never pays its import

        for name in ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16"):
            for dt in (numpy.dtype(name).newbyteorder("<"), numpy.dtype(name).newbyteorder(">")):
                _DTYPES_DEC[dt.str.encode()] = dt
                _DTYPES_ENC[dt.str] = dt.str.encode()
        _SKIP.add(numpy.ndarray)
        _numpy_module = numpy
    return _numpy_module


# extension registry: class -> (code, to_obj); code -> (cls, from_obj)
_EXT_ENC: dict[type, tuple[int, Callable[[Any], Any]]] = {}
_EXT_DEC: dict[int, tuple[type, Callable[[Any], Any]]] = {}
_KEY_TYPES: set[type] = {str, int, bytes}


def register_ext(code: int, cls: type, to_obj: Callable[[Any], Any], from_obj: Callable[[Any], Any]) -> None:
    """Let instances of ``cls`` (exact type) travel as msgpack ext ``code``; 16..63 are Lattica's.

    ``to_obj`` turns an instance into codec-able data (encoded recursively, may hold big buffers);
    ``from_obj`` rebuilds it and raises CodecError or ValueError on bad data.
    """
    if not isinstance(code, int) or not 0 <= code <= 127 or code in _RESERVED_CODES:
        raise ValueError(f"extension code must be in 16..127, got {code!r}")
    if not isinstance(cls, type) or not callable(to_obj) or not callable(from_obj):
        raise TypeError("register_ext needs a class and two callables")
    if _EXT_DEC.get(code, (cls,))[0] is not cls or _EXT_ENC.get(cls, (code,))[0] != code:
        raise ValueError(f"extension code {code} or class {cls.__qualname__} is already registered")
    _EXT_ENC[cls] = (code, to_obj)
    _EXT_DEC[code] = (cls, from_obj)
    _KEY_TYPES.add(cls)
    _SKIP.add(cls)


def register_encoder(cls: type, code: int, to_obj: Callable[[Any], Any]) -> None:
    """Let instances of ``cls`` (exact type) also travel as the registered extension ``code``
    (whose decoder tells them apart): several path classes, the user's registered values."""
    if code not in _EXT_DEC or _EXT_ENC.get(cls, (code,))[0] != code or not callable(to_obj):
        raise ValueError(f"extension code {code} is not registered, or {cls.__qualname__} already travels as another")
    _EXT_ENC[cls] = (code, to_obj)
    _KEY_TYPES.add(cls)
    _SKIP.add(cls)


_VALUE_MODULES = frozenset({"builtins", "datetime", "uuid", "decimal", "pathlib"})  # of the types lattica.values adds
_VALUE_CODES = range(40, 50)
_values: Any = None  # lattica.values, once loaded


def _load_values() -> bool:
    """Load ``lattica.values`` (sets, datetimes, UUIDs, decimals, paths, registered dataclasses
    and enums) and register its extensions, the first time one is met; False if it was loaded
    already (then the type is simply not supported)."""
    global _values
    if _values is not None:
        return False
    import lattica.values as values  # (the first such value loads them: a starting node does not)

    for code, cls, to_obj, from_obj in values.EXTENSIONS:
        if code in _EXT_DEC:
            register_encoder(cls, code, to_obj)
        else:
            register_ext(code, cls, to_obj, from_obj)
    _values = values
    return True


def _type_name(o: object) -> str:
    t = type(o)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# -- encoding --------------------------------------------------------------------------------------


class _Encoder:
    """Per-thread encoding state: a reusable Packer plus the buffers of the frame being built."""

    __slots__ = ("packer", "limits", "bufs", "level", "busy", "tuples")

    def __init__(self) -> None:
        self.packer = msgpack.Packer(default=self.default)
        self.limits = DEFAULT_LIMITS
        self.bufs: list[bytes | bytearray | memoryview] = []
        self.level = 0
        self.busy = False
        self.tuples = False  # the frame holds a tuple marker

    def add_buffer(self, buf: bytes | bytearray | memoryview) -> int:
        if len(self.bufs) >= self.limits.max_buffers:
            raise CodecError(f"more than {self.limits.max_buffers} out-of-band buffers")
        self.bufs.append(buf)
        return len(self.bufs) - 1

    def walk(self, o: Any, depth: int) -> Any:
        """Check depth, lengths and key types; return ``o`` with big bytes made buffer refs."""
        t = type(o)
        if t is dict or t is list:
            is_dict = t is dict
        elif isinstance(o, tuple) and t not in _SKIP:
            self.tuples = True  # a marked array: it decodes as a tuple again
            return self.walk([_TUPLE_MARK, *o], depth)
        elif isinstance(o, list):  # a named view over a wire list (rpc.CallMsg): no bytes-like test
            is_dict = False
        elif isinstance(o, _BYTES_LIKE):
            return self.out_of_band(o)
        elif isinstance(o, dict):
            is_dict = True
        else:
            return o  # scalars, arrays, extension types, unsupported types: Packer + default()
        lim = self.limits
        if depth >= lim.max_depth:
            raise CodecError(f"message nested deeper than {lim.max_depth} levels")
        if len(o) > lim.max_items:
            raise CodecError(f"{t.__name__} of {len(o)} items exceeds the limit of {lim.max_items}")
        thr = lim.oob_threshold
        new: Any = None
        if is_dict:
            for k, v in o.items():
                if type(k) is not str and type(k) not in _KEY_TYPES:
                    raise CodecError(f"cannot encode a map key of type {_type_name(k)}")
                tv = type(v)
                if tv in _SKIP or (tv is bytes and len(v) < thr):
                    continue
                nv = self.walk(v, depth + 1)
                if nv is not v:
                    if new is None:
                        new = dict(o)
                    new[k] = nv
        elif len(o) <= 16 or not _SKIP.issuperset(map(type, o)):
            i = -1
            for v in o:
                i += 1
                tv = type(v)
                if tv in _SKIP or (tv is bytes and len(v) < thr):
                    continue
                nv = self.walk(v, depth + 1)
                if nv is not v:
                    if new is None:
                        new = list(o)
                    new[i] = nv
        return o if new is None else new

    def out_of_band(self, o: bytes | bytearray | memoryview) -> Any:
        """``o`` itself if small, else a reference to a new out-of-band buffer holding it."""
        if isinstance(o, memoryview):
            if o.nbytes < self.limits.oob_threshold:
                return o
            if not o.c_contiguous:
                raise CodecError("cannot encode a non-contiguous memoryview")
            if o.ndim != 1 or o.format != "B":
                o = o.cast("B")
        elif len(o) < self.limits.oob_threshold:
            return o
        return _ext(msgpack.ExtType, (_EXT_OOB, _U32.pack(self.add_buffer(o))))

    def pack(self, obj: Any, packer: msgpack.Packer) -> bytes:
        obj = self.walk(obj, 0)
        try:
            body: bytes = packer.pack(obj)
        except (CodecError, FrameTooLarge):
            raise
        except (TypeError, ValueError, OverflowError, BufferError) as e:
            raise CodecError(f"cannot encode message: {e}") from None
        if len(body) > self.limits.max_str:
            _check_sizes(obj, self.limits.max_str)
        return body

    def default(self, o: Any) -> msgpack.ExtType:
        """Packer hook for every type msgpack does not know: extensions, numpy, or refusal."""
        ext = _EXT_ENC.get(type(o))
        if ext is not None:
            return self.pack_ext(o, *ext)
        np = _numpy() if "numpy" in sys.modules else None  # no numpy loaded: o is no numpy value
        if np is not None and isinstance(o, np.ndarray):
            return self.pack_array(o)
        if np is not None and isinstance(o, np.generic):
            dts = _DTYPES_ENC.get(o.dtype.str)
            if dts is None:
                raise CodecError(f"cannot encode numpy scalar of dtype {o.dtype}")
            return _ext(msgpack.ExtType, (_EXT_SCALAR, bytes([len(dts)]) + dts + o.tobytes()))
        if _values is not None and _values.name_of(type(o)) is not None:
            return self.pack_ext(o, _values.REGISTERED_CODE, _values.value_to_obj)
        if (type(o).__module__ in _VALUE_MODULES or "lattica.values" in sys.modules) and _load_values():
            return self.default(o)
        if isinstance(o, int):  # the Packer hands over ints it cannot represent
            raise CodecError(f"integer of {o.bit_length()} bits is out of msgpack range (-2**63 .. 2**64-1)")
        raise CodecError(
            f"cannot encode object of type {_type_name(o)}: calls carry data (None, bool, int, float, "
            "str, bytes, list, tuple, dict, set, datetime, UUID, Decimal, paths, numpy arrays, ActorRef, "
            "...), not live objects; register a dataclass or an Enum with lattica.values.register(cls), "
            "or pass its fields (docs/api.md, 'Arguments and results')"
        )

    def pack_array(self, a: np.ndarray) -> msgpack.ExtType:
        np = _numpy()
        if type(a) is not np.ndarray and type(a) is not np.memmap:
            raise CodecError(f"cannot encode ndarray subclass {_type_name(a)}")
        dts = _DTYPES_ENC.get(a.dtype.str)
        if dts is None:
            raise CodecError(f"cannot encode numpy array of dtype {a.dtype} (not bool/int/float)")
        if a.ndim > _MAX_NDIM:
            raise CodecError(f"cannot encode a {a.ndim}-dimensional array (max {_MAX_NDIM})")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        inline = a.nbytes < self.limits.oob_threshold
        idx = _INLINE
        if not inline:
            idx = self.add_buffer(memoryview(a.reshape(-1).view(np.uint8)))
        head = _ARR.pack(a.ndim, len(dts), 0, idx) + struct.pack(f"<{a.ndim}Q", *a.shape)
        head += dts + _PAD[-len(dts) % 8]
        return _ext(msgpack.ExtType, (_EXT_ARRAY, head + a.tobytes() if inline else head))

    def pack_ext(self, o: Any, code: int, to_obj: Callable[[Any], Any]) -> msgpack.ExtType:
        try:
            data = to_obj(o)
        except (CodecError, FrameTooLarge):
            raise
        except Exception as e:
            raise CodecError(f"cannot encode {_type_name(o)}: {e}") from None
        if type(data) is bytes and len(data) < 256:  # common case (ids, addresses): msgpack bin 8
            return _ext(msgpack.ExtType, (code, _BIN8[len(data)] + data))
        if self.level >= _MAX_EXT_NESTING:
            raise CodecError(f"extension types nested deeper than {_MAX_EXT_NESTING} levels")
        self.level += 1
        try:
            payload = self.pack(data, msgpack.Packer(default=self.default))
            return _ext(msgpack.ExtType, (code, payload))
        finally:
            self.level -= 1


def _check_sizes(o: Any, max_str: int) -> None:
    """Refuse any str/bytes longer than max_str (only run when the whole body is that large)."""
    if isinstance(o, str):
        if len(o) * 4 > max_str and len(o.encode("utf-8", "surrogatepass")) > max_str:
            raise CodecError(f"string longer than the limit of {max_str} bytes")
    elif isinstance(o, (bytes, bytearray)):
        if len(o) > max_str:
            raise CodecError(f"bytes longer than the limit of {max_str} bytes")
    elif isinstance(o, memoryview):
        if o.nbytes > max_str:
            raise CodecError(f"bytes longer than the limit of {max_str} bytes")
    elif isinstance(o, dict):
        for k, v in o.items():
            _check_sizes(k, max_str)
            _check_sizes(v, max_str)
    elif isinstance(o, (list, tuple)):
        for v in o:
            _check_sizes(v, max_str)


class _Local(threading.local):
    def __init__(self) -> None:
        self.enc = _Encoder()


_local = _Local()


def encode(obj: Any, limits: Limits = DEFAULT_LIMITS) -> list[bytes | bytearray | memoryview]:
    """Encode ``obj`` as one frame: ``[header, body, (pad, buffer)...]``, buffers not copied."""
    enc = _local.enc
    if enc.busy:  # re-entered from an extension's to_obj: use a private encoder
        enc = _Encoder()
    enc.busy = True
    enc.limits = limits
    try:
        body = enc.pack(obj, enc.packer)
        bufs = enc.bufs
        if not bufs:
            if len(body) + 8 > limits.max_frame:
                raise FrameTooLarge(_too_large(len(body) + 8, limits))
            return [_HDR.pack(_VERSION, _FLAG_TUPLES if enc.tuples else 0, 0, len(body)), body]
        n = len(bufs)
        lens = [len(b) for b in bufs]
        chunks: list[bytes | bytearray | memoryview] = [b"", body]
        pos = 8 + 8 * n + len(body)
        for b, size in zip(bufs, lens):
            if pos & 7:
                chunks.append(_PAD[-pos & 7])
                pos += -pos & 7
            chunks.append(b)
            pos += size
        if pos > limits.max_frame:
            raise FrameTooLarge(_too_large(pos, limits))
        chunks[0] = _HDR.pack(_VERSION, _FLAG_TUPLES if enc.tuples else 0, n, len(body)) + struct.pack(f"<{n}Q", *lens)
        return chunks
    except struct.error as e:  # body over 4 GiB with a custom max_frame
        raise FrameTooLarge(f"message too large for the frame header: {e}") from None
    except RecursionError:  # only with a huge custom max_depth
        raise CodecError("message nested too deeply to encode") from None
    finally:
        if enc.bufs:
            enc.bufs.clear()
        enc.level = 0
        enc.busy = False
        enc.tuples = False


def _too_large(size: int, limits: Limits) -> str:
    cap = f"{limits.max_frame >> 20} MiB" if limits.max_frame >= 1 << 20 else f"{limits.max_frame} bytes"
    return (
        f"a message of {size} bytes is over the {cap} a call's arguments or result may hold: "
        "send big data by CID (cid = lattica.content.put(data).result(), pass the cid, and "
        "lattica.content.get(cid) where it is needed), or stream it (a generator method, or an async iterator argument)"
    )


def check(obj: Any, limits: Limits = DEFAULT_LIMITS) -> None:
    """CodecError (or FrameTooLarge) unless ``obj`` could be sent; the frame is dropped, and big
    buffers are only referenced, never copied."""
    encode(obj, limits)


def encode_bytes(obj: Any, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Encode ``obj`` as one contiguous frame (copies the buffers; use encode() to avoid that)."""
    chunks = encode(obj, limits)
    # two chunks: no buffers, [header (bytes), body]
    return cast(bytes, chunks[0]) + chunks[1] if len(chunks) == 2 else b"".join(chunks)


# -- decoding --------------------------------------------------------------------------------------


def _decode_array(data: bytes, bufs: list[memoryview] | None) -> np.ndarray:
    numpy = _numpy()
    if len(data) < 8:
        raise CodecError("truncated numpy array header")
    ndim, dtlen, reserved, idx = _ARR.unpack_from(data)
    if reserved or ndim > _MAX_NDIM:
        raise CodecError("malformed numpy array header")
    pos = 8 + 8 * ndim
    end = pos + dtlen + (-dtlen % 8)
    if end > len(data):
        raise CodecError("truncated numpy array header")
    shape = struct.unpack_from(f"<{ndim}Q", data, 8)
    dt = _DTYPES_DEC.get(data[pos : pos + dtlen])
    if dt is None:
        raise CodecError(f"numpy dtype {data[pos : pos + dtlen]!r} is not allowed")
    count = prod(shape)
    if idx == _INLINE:
        buf, offset = data, end
    elif bufs is not None and idx < len(bufs):
        buf, offset = bufs[idx], 0
    else:
        raise CodecError(f"numpy array refers to missing buffer {idx}")
    if len(buf) - offset != count * dt.itemsize:
        raise CodecError(f"numpy array data is {len(buf) - offset} bytes, shape {shape} needs {count * dt.itemsize}")
    out: np.ndarray = numpy.frombuffer(buf, dtype=dt, count=count, offset=offset).reshape(shape)
    return out


def _decode_scalar(data: bytes) -> np.generic:
    numpy = _numpy()
    dt = _DTYPES_DEC.get(data[1 : 1 + data[0]]) if data else None
    if dt is None or len(data) != 1 + data[0] + dt.itemsize:
        raise CodecError("malformed or disallowed numpy scalar")
    scalar: np.generic = numpy.frombuffer(data, dtype=dt, count=1, offset=1 + data[0])[0]
    return scalar


_COUNT_FROM = 64 * 1024  # a body this big counts its lists and maps (a Python call for each)
_EXT_COST = 8  # an extension value counts as this many containers (decoded in Python: ~3 us, not ~60 ns)


def _counter(budget: list[int], limit: int) -> Callable[[Any], Any]:
    """A msgpack list/object hook that counts containers against ``budget[0]``: a few bytes of
    body can make a list object of ~60 bytes, so a big body must not make millions of them."""

    def count(o: Any) -> Any:
        budget[0] += 1
        if budget[0] > limit:
            raise CodecError(f"message holds more than {limit} lists and maps")
        return o

    return count


def _make_hook(
    bufs: list[memoryview] | None, limits: Limits, level: int, budget: list[int] | None = None, tuples: bool = False
) -> Callable[[int, bytes], Any]:
    """The msgpack ext_hook for one payload: buffer refs, numpy values, registered types
    (``budget``: the frame's container count, shared with nested payloads; ``tuples``: the frame
    declares tuple markers)."""

    def hook(code: int, data: bytes) -> Any:
        if code == _EXT_TUPLE:
            if not tuples or data:
                raise CodecError("a tuple marker in a frame that declares no tuples")
            return _TUPLE_SENTINEL
        if budget is not None:
            budget[0] += _EXT_COST
            if budget[0] > limits.max_containers:
                raise CodecError(f"message holds more extension values than {limits.max_containers // _EXT_COST}")
        if code == _EXT_OOB:
            if len(data) != 4 or bufs is None or _U32.unpack(data)[0] >= len(bufs):
                raise CodecError("reference to a missing out-of-band buffer")
            return bufs[_U32.unpack(data)[0]]
        if code == _EXT_ARRAY:
            return _decode_array(data, bufs)
        if code == _EXT_SCALAR:
            return _decode_scalar(data)
        ext = _EXT_DEC.get(code)
        if ext is None and code in _VALUE_CODES and _load_values():
            ext = _EXT_DEC.get(code)
        if ext is None:
            raise CodecError(f"unknown extension type {code}")
        if len(data) >= 2 and data[0] == 0xC4 and len(data) == 2 + data[1]:
            inner: Any = data[2:]  # short bin payload, as pack_ext writes ids and addresses
        elif level >= _MAX_EXT_NESTING:
            raise CodecError(f"extension types nested deeper than {_MAX_EXT_NESTING} levels")
        else:
            inner = _unpack(data, bufs, limits, level + 1, budget, tuples)
        try:
            return ext[1](inner)
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(f"bad {ext[0].__qualname__} payload: {e}") from None

    return hook


_HOOK0 = _make_hook(None, DEFAULT_LIMITS, 0)


def _as_tuple(count: Callable[[Any], Any] | None) -> Callable[[list[Any]], Any]:
    """A list hook that turns marked arrays into tuples (after ``count``, if counting)."""

    def hook(o: list[Any]) -> Any:
        if count is not None:
            count(o)
        if o and o[0] is _TUPLE_SENTINEL:
            return tuple(o[1:])
        return o

    return hook


def _check_depth(o: list[Any] | dict[Any, Any] | tuple[Any, ...], budget: int) -> None:
    """Raise CodecError when containers nest deeper than ``budget`` levels below ``o``'s parent."""
    if budget <= 0:
        raise CodecError("message nested too deeply")
    vals = o.values() if type(o) is dict else o
    if len(vals) > 16 and _LEAF.issuperset(map(type, vals)):
        return
    for v in vals:
        if type(v) in _CONTAINERS:
            _check_depth(v, budget - 1)


def _unpack(
    body: bytes | bytearray | memoryview,
    bufs: list[memoryview] | None,
    limits: Limits,
    level: int,
    budget: list[int] | None = None,
    tuples: bool = False,
) -> Any:
    """Decode one msgpack body (the frame's, or an extension payload) under ``limits``."""
    n = len(body)
    if budget is None and n > _COUNT_FROM:
        budget = [0]
    if budget is None and bufs is None and limits is DEFAULT_LIMITS and level == 0 and not tuples:
        hook = _HOOK0
    else:
        hook = _make_hook(bufs, limits, level, budget, tuples)
    counted: dict[str, Any] = {}
    paused = False
    if budget is not None:
        count = _counter(budget, limits.max_containers)
        counted = {"list_hook": _as_tuple(count) if tuples else count, "object_hook": count}
    elif tuples:
        counted = {"list_hook": _as_tuple(None)}
    if budget is not None:
        # the collector would walk the growing heap of new containers again and again (most of
        # the time of a big body's decoding); it runs once this is done
        paused = level == 0 and gc.isenabled()
        if paused:
            gc.disable()
    try:
        if n <= limits._floor:  # msgpack's own caps (each item needs >= 1 byte of body) are tighter
            obj = msgpack.unpackb(body, strict_map_key=False, timestamp=2, ext_hook=hook, **counted)
        else:
            cap, scap = min(n, limits.max_items), min(n, limits.max_str)
            obj = msgpack.unpackb(
                body, strict_map_key=False, timestamp=2, ext_hook=hook, max_str_len=scap,
                max_bin_len=scap, max_ext_len=scap, max_array_len=cap, max_map_len=min(cap, n // 2), **counted,
            )  # fmt: skip
    finally:
        if paused:
            gc.enable()
    if n > limits.max_depth and type(obj) in _CONTAINERS:
        _check_depth(obj, limits.max_depth)
    return obj


_MSGPACK_ERRORS = {
    msgpack.StackError: "nested deeper than the decoder allows",
    msgpack.ExtraData: "trailing bytes after the message body",
    msgpack.FormatError: "invalid msgpack type byte",
}


def decode(frame: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode one complete frame; out-of-band data comes back as views of ``frame`` (no copy)."""
    try:
        if not isinstance(frame, (bytes, bytearray)):
            frame = memoryview(frame)
            if frame.ndim != 1 or frame.itemsize != 1:
                frame = frame.cast("B")
        n = len(frame)
        if n > limits.max_frame:
            raise FrameTooLarge(f"frame of {n} bytes exceeds max_frame {limits.max_frame}")
        if n < 8:
            raise CodecError(f"truncated frame header ({n} bytes)")
        version, flags, nbuf, blen = _HDR.unpack_from(frame)
        if version != _VERSION or flags & ~_FLAG_TUPLES:
            raise CodecError(f"unsupported codec frame version {version} / flags {flags}")
        tuples = bool(flags)
        if nbuf == 0:
            if blen + 8 != n:
                raise CodecError(f"frame is {n} bytes but its header declares {blen + 8}")
            body = frame[8:] if n < 4096 else memoryview(frame)[8:]
            if limits is DEFAULT_LIMITS and n < 4096 and not tuples:  # the hot path: small message, default caps
                obj = msgpack.unpackb(body, strict_map_key=False, timestamp=2, ext_hook=_HOOK0)
                if n > 8 + DEFAULT_LIMITS.max_depth and type(obj) in _CONTAINERS:
                    _check_depth(obj, DEFAULT_LIMITS.max_depth)
                return obj
            return _unpack(body, None, limits, 0, tuples=tuples)
        if nbuf > limits.max_buffers:
            raise CodecError(f"frame declares {nbuf} buffers, the limit is {limits.max_buffers}")
        pos = 8 + 8 * nbuf + blen
        if pos > n:
            raise CodecError("truncated frame: header and body exceed the frame")
        mv = memoryview(frame)
        bufs = []
        for size in struct.unpack_from(f"<{nbuf}Q", frame, 8):
            pos += -pos & 7
            if pos + size > n:
                raise CodecError("out-of-band buffer extends beyond the frame")
            bufs.append(mv[pos : pos + size])
            pos += size
        if pos != n:
            raise CodecError(f"{n - pos} trailing bytes after the last buffer")
        return _unpack(mv[8 + 8 * nbuf : 8 + 8 * nbuf + blen], bufs, limits, 0, tuples=tuples)
    except (CodecError, FrameTooLarge):
        raise
    except Exception as e:
        why = _MSGPACK_ERRORS.get(type(e)) or f"{type(e).__name__}: {e}"
        raise CodecError(f"malformed message: {why}") from None


# -- lattica's own extension types -----------------------------------------------------------------


def _as_bytes(data: Any) -> bytes:
    if not isinstance(data, (bytes, memoryview)):
        raise CodecError(f"expected bytes, got {_type_name(data)}")
    return bytes(data)


_peer_ids: dict[bytes, PeerId] = {}  # parsed PeerIds (immutable), as the same few peers recur


def _peer_id_from(data: Any) -> PeerId:
    raw = _as_bytes(data)
    pid = _peer_ids.get(raw)
    if pid is None:
        pid = PeerId.from_bytes(raw)
        if len(_peer_ids) >= 4096:
            _peer_ids.clear()
        _peer_ids[raw] = pid
    return pid


register_ext(16, PeerId, PeerId.to_bytes, _peer_id_from)
register_ext(17, Multiaddr, Multiaddr.to_bytes, lambda d: Multiaddr.from_bytes(_as_bytes(d)))
