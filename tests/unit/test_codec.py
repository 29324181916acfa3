"""Codec frames: round trips, zero-copy out-of-band buffers, limits, and hostile input fuzzing."""

from __future__ import annotations

import collections
import inspect
import math
import pickle
import struct
import sys
import threading
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lattica import codec
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.codec import DEFAULT_LIMITS, Limits, decode, encode, encode_bytes, register_ext
from lattica.errors import CodecError, FrameTooLarge, ProtocolError

MiB = 1024 * 1024
PID = KeyPair.from_seed(bytes(range(32))).peer_id
MA = "/ip4/1.2.3.4/tcp/5"


def rt(obj, limits=DEFAULT_LIMITS):
    """Encode then decode through one contiguous frame."""
    return decode(encode_bytes(obj, limits), limits)


def frame(body: bytes, bufs: tuple[bytes, ...] = (), version: int = 1, flags: int = 0) -> bytes:
    """Build a frame by hand, following docs/protocols.md (independent of the encoder)."""
    out = struct.pack("<BBHI", version, flags, len(bufs), len(body))
    out += b"".join(struct.pack("<Q", len(b)) for b in bufs) + body
    for b in bufs:
        out += b"\0" * (-len(out) % 8) + b
    return out


def ext(code: int, data: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, data))


def array_payload(dtype: bytes, shape: tuple, index: int = 0xFFFFFFFF, data: bytes = b"") -> bytes:
    head = struct.pack("<BBHI", len(shape), len(dtype), 0, index)
    head += struct.pack(f"<{len(shape)}Q", *shape)
    return head + dtype + b"\0" * (-len(dtype) % 8) + data


# -- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, 1, -1, 127, 128, -33, 2**31, 2**63 - 1, 2**64 - 1, -(2**63),
        0.0, -0.0, 1.5, -2.25e-300, 1e308, math.inf, -math.inf,
        "", "ascii", "ünïcødé €", "😀 emoji \u0000 nul", "x" * 70000,
        b"", b"\x00\xff", b"y" * 1000, [], {}, [1, [2, [3, [4]]]], {"a": {"b": {"c": [None]}}},
        {1: "int key", b"bk": "bytes key", "s": "str key", -5: [1.5]},
    ],
)  # fmt: skip
def test_scalar_and_container_round_trip(value):
    assert rt(value) == value
    assert type(rt(value)) is type(value)


def test_nan_round_trips():
    out = rt([math.nan, {"x": math.nan}])
    assert math.isnan(out[0]) and math.isnan(out[1]["x"])


def test_tuples_come_back_as_tuples_and_small_bytes_likes_as_bytes():
    out = rt((1, (2, 3), [(4,)], {"t": ()}))
    assert out == (1, (2, 3), [(4,)], {"t": ()}) and type(out[2]) is list
    Point = collections.namedtuple("Point", "x y")
    assert rt([Point(1, 2)]) == [(1, 2)]  # a named tuple arrives as a plain tuple
    assert codec.encode([1, 2])[0][1] == 0 and codec.encode([(1, 2)])[0][1] == 1  # the header says so
    big = b"x" * (1 << 17)
    out = rt((big, (big,)))
    assert type(out) is tuple and type(out[1]) is tuple and bytes(out[1][0]) == big
    assert rt(bytearray(b"abc")) == b"abc"
    assert rt(memoryview(b"abc")) == b"abc"
    assert rt(memoryview(np.arange(4, dtype=np.uint16))) == np.arange(4, dtype=np.uint16).tobytes()


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**100])
def test_ints_beyond_64_bits_are_refused(value):
    with pytest.raises(CodecError, match="out of msgpack range"):
        encode([value])


def test_big_envelope_round_trip():
    env = {
        "to": "worker-3", "method": "forward", "call_id": 2**40, "deadline": 12.5, "sender": PID,
        "args": (np.arange(10, dtype=np.float32), b"z" * MiB, "text"),
        "kwargs": {"temperature": 0.7},
    }  # fmt: skip
    out = rt(env)
    assert out["sender"] == PID
    assert np.array_equal(out["args"][0], env["args"][0])
    assert bytes(out["args"][1]) == env["args"][1]
    assert out["args"][2] == "text" and out["kwargs"] == {"temperature": 0.7}


# -- numpy -----------------------------------------------------------------------------------------

ARRAYS = [
    np.array(3.5),
    np.array(7, dtype=np.int8),
    np.zeros((0,), dtype=np.float32),
    np.zeros((3, 0, 2), dtype=np.int64),
    np.arange(12, dtype=np.int32).reshape(3, 4),
    np.arange(24, dtype=">f8").reshape(2, 3, 4),
    np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4)),
    np.arange(40, dtype=np.float64)[::3],
    np.arange(64, dtype=np.int16).reshape(8, 8)[1::2, ::-3],
    np.array([True, False, True]),
    np.arange(6, dtype=np.complex64) * (1 + 2j),
    np.linspace(0, 1, 7, dtype=np.float16),
    np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5),
    np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32),  # out of band
    np.asfortranarray(np.random.default_rng(1).integers(0, 9, (200, 100))),  # OOB, made contiguous
    np.random.default_rng(2).standard_normal((400, 400))[::2, 1::3],  # OOB, non-contiguous
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_array_round_trip(arr):
    out = rt(arr)
    assert type(out) is np.ndarray
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.array_equal(out, arr)
    assert out.flags.c_contiguous and out.flags.aligned


@pytest.mark.parametrize(
    "scalar",
    [np.int8(-3), np.uint64(2**64 - 1), np.float32(1.25), np.float16(0.5), np.complex128(1 - 2j)] + [np.bool_(True)],
)
def test_numpy_scalars_keep_their_type(scalar):
    out = rt(scalar)
    assert type(out) is type(scalar) and out == scalar


def test_numpy_float64_is_a_float():
    out = rt(np.float64(2.5))
    assert type(out) is float and out == 2.5


@pytest.mark.parametrize(
    "bad",
    [
        np.array([object(), 1], dtype=object),
        np.array(["text"]),
        np.array([b"by"]),
        np.zeros(2, dtype="datetime64[s]"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.ma.array([1, 2], mask=[0, 1]),
        np.datetime64("2024-01-01"),
        np.void(b"\x00"),
    ],
)
def test_forbidden_numpy_values_are_refused(bad):
    with pytest.raises(CodecError):
        encode({"x": bad})


@pytest.mark.parametrize("dtype", [b"|O8", b"|O", b"<U1", b"|S4", b"|V8", b"<M8[s]", b"f8", b"", b"\xff\xfe"])
def test_forbidden_dtypes_are_refused_on_decode(dtype):
    body = ext(1, array_payload(dtype, (1,), data=b"\0" * 8))
    with pytest.raises(CodecError):
        decode(frame(body))


def test_array_data_length_must_match_shape():
    with pytest.raises(CodecError, match="needs"):
        decode(frame(ext(1, array_payload(b"<f4", (3,), data=b"\0" * 8))))
    with pytest.raises(CodecError, match="needs"):
        decode(frame(ext(1, array_payload(b"<f4", (2**40, 2**40), index=0)), (b"\0" * 16,)))
    with pytest.raises(CodecError):
        decode(frame(ext(1, array_payload(b"<f4", (0, 2**63)))))


def test_pickle_is_never_involved(monkeypatch):
    src = inspect.getsource(codec)
    assert "pickle" not in src and "allow_pickle" not in src

    def refuse(*a, **k):
        raise AssertionError("pickle used")

    for name in ("loads", "load", "dumps", "dump", "Unpickler", "Pickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(np, "load", refuse)
    for arr in ARRAYS:
        assert np.array_equal(rt(arr), arr)


# -- out-of-band buffers and zero copy -------------------------------------------------------------


def test_small_message_is_header_and_body_only():
    env = {"to": "actor", "method": "f", "args": [b"x" * 128], "call_id": 17, "deadline": 1.5}
    chunks = encode(env)
    assert len(chunks) == 2 and len(chunks[0]) == 8
    assert struct.unpack("<BBHI", chunks[0]) == (1, 0, 0, len(chunks[1]))


def test_big_bytes_travel_out_of_band_without_copies():
    big = b"\xab" * MiB
    arr = np.arange(MiB // 8, dtype=np.float64)
    msg = {"blob": big, "arr": arr, "small": b"s" * 100}
    chunks = encode(msg)
    assert any(c is big for c in chunks)  # the bytes object itself, not a copy
    arr_chunk = next(c for c in chunks if isinstance(c, memoryview))
    assert np.shares_memory(np.frombuffer(arr_chunk, dtype=np.uint8), arr)
    body_len = struct.unpack_from("<I", chunks[0], 4)[0]
    assert body_len < 500  # neither payload went into the msgpack body
    assert sum(len(c) for c in chunks) == len(encode_bytes(msg))


def test_decode_is_zero_copy():
    big = bytes(range(256)) * 4096
    arr = np.random.default_rng(3).standard_normal((256, 512))
    f = encode_bytes([big, arr, {"nested": [bytearray(big)]}])
    out = decode(f)
    assert isinstance(out[0], memoryview) and out[0].obj is f and out[0] == big
    assert out[2]["nested"][0].obj is f
    assert np.shares_memory(out[1], np.frombuffer(f, dtype=np.uint8))
    base = out[1]
    while not isinstance(base, memoryview):
        base = base.base
    assert base.obj is f
    assert not out[1].flags.writeable  # a view of immutable bytes
    assert out[1].ctypes.data % 8 == 0  # buffers are 8-aligned within the frame


def test_bytearray_and_memoryview_frames():
    arr = np.arange(100_000, dtype=np.int32)
    f = bytearray(encode_bytes({"a": arr, "b": b"q" * 70000}))
    out = decode(f)
    assert out["a"].flags.writeable and np.array_equal(out["a"], arr)
    out["a"][0] = 42  # writes through to the frame: it is a view
    assert decode(f)["a"][0] == 42
    mv = memoryview(bytes(encode_bytes({"a": arr})))
    assert np.array_equal(decode(mv)["a"], arr)
    assert decode(memoryview(encode_bytes([1, 2, 3])).cast("H")) == [1, 2, 3]


def test_buffers_are_aligned_in_the_chunk_list():
    blobs = [b"a" * 65537, b"b" * 65539]
    chunks = encode([*blobs, np.ones(20000, dtype=np.complex128)])
    pos, starts = 0, []
    for c in chunks:
        if any(c is b for b in blobs) or isinstance(c, memoryview):
            starts.append(pos)
        pos += len(c)
    assert len(starts) == 3 and all(s % 8 == 0 for s in starts)
    f = b"".join(chunks)
    assert struct.unpack_from("<H", f, 2)[0] == 3
    out = decode(f)
    assert all(m.obj is f for m in out[:2])
    assert out[2].ctypes.data % 8 == 0


def test_big_memoryviews_go_out_of_band_flat():
    m = memoryview(np.arange(40000, dtype=np.float32).reshape(200, 200))
    out = rt(m)
    assert isinstance(out, memoryview) and out.format == "B" and out.nbytes == m.nbytes
    assert bytes(out) == m.tobytes()
    with pytest.raises(CodecError, match="contiguous"):
        encode(memoryview(bytes(300000))[::2])
    with pytest.raises(CodecError):
        encode(memoryview(bytes(100))[::2])


def test_custom_threshold():
    lim = Limits(oob_threshold=16)
    chunks = encode([b"x" * 16, b"y" * 15], lim)
    assert len(chunks) > 2
    out = decode(b"".join(chunks), lim)
    assert isinstance(out[0], memoryview) and out[1] == b"y" * 15


# -- hypothesis: round trips -----------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(max_size=64)
)
keys = st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(keys, children, max_size=6),
    max_leaves=40,
)


@given(values)
@settings(max_examples=300, deadline=None)
def test_property_round_trip(value):
    assert rt(value) == value


@given(values)
@settings(max_examples=100, deadline=None)
def test_property_round_trip_everything_out_of_band(value):
    lim = Limits(oob_threshold=0)
    out = decode(b"".join(encode(value, lim)), lim)

    def norm(v):
        if isinstance(v, memoryview):
            return bytes(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    assert norm(out) == value


# -- hypothesis: hostile input ---------------------------------------------------------------------


def decode_safely(data: bytes, limits: Limits = DEFAULT_LIMITS):
    try:
        decode(data, limits)
    except (CodecError, FrameTooLarge) as e:
        assert isinstance(e, ProtocolError)
        assert str(e)


@given(st.binary(max_size=2000))
@settings(max_examples=1500, deadline=None)
def test_fuzz_arbitrary_bytes(data):
    decode_safely(data)


@given(st.binary(max_size=600), st.integers(0, 3))
@settings(max_examples=1500, deadline=None)
def test_fuzz_valid_header_arbitrary_body(body, nbuf):
    bufs = tuple(b"\x01" * (17 * i) for i in range(nbuf))
    decode_safely(frame(body, bufs))


SAMPLES = [
    encode_bytes({"to": "a", "method": "m", "args": [1, "two", b"3", 4.0, None], "kw": {"k": [1]}}),
    encode_bytes([np.arange(6, dtype=np.int16).reshape(2, 3), np.float32(1), PID, Multiaddr(MA)]),
    encode_bytes({"big": b"b" * 70000, "arr": np.ones(9000), "m": {1: [b"x"]}}),
]


@given(st.sampled_from(SAMPLES), st.data())
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_frames(sample, data):
    f = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "extend", "insert", "delete"]))
        if not f:
            break
        i = data.draw(st.integers(0, len(f) - 1))
        if op == "flip":
            f[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            f[i] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del f[i:]
        elif op == "extend":
            f += data.draw(st.binary(min_size=1, max_size=16))
        elif op == "insert":
            f[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            del f[i : i + data.draw(st.integers(1, 8))]
    decode_safely(bytes(f))
    decode_safely(f)


def test_every_single_byte_flip_of_a_sample_is_safe():
    for sample in SAMPLES[:2]:
        for i in range(len(sample)):
            for bit in range(8):
                f = bytearray(sample)
                f[i] ^= 1 << bit
                decode_safely(bytes(f))
        for n in range(len(sample)):
            decode_safely(sample[:n])


# -- limits ----------------------------------------------------------------------------------------


def test_frame_larger_than_max_frame():
    lim = Limits(max_frame=1000)
    with pytest.raises(FrameTooLarge):
        decode(encode_bytes(b"x" * 2000), lim)
    with pytest.raises(FrameTooLarge):
        encode(b"x" * 2000, lim)
    with pytest.raises(FrameTooLarge):
        encode(np.zeros(200000), lim)
    assert issubclass(FrameTooLarge, ProtocolError) and issubclass(CodecError, ProtocolError)


def test_too_many_buffers():
    lim = Limits(max_buffers=2, oob_threshold=8)
    with pytest.raises(CodecError, match="buffers"):
        encode([b"a" * 8, b"b" * 8, b"c" * 8], lim)
    f = encode_bytes([b"a" * 8, b"b" * 8, b"c" * 8], Limits(oob_threshold=8))
    with pytest.raises(CodecError, match="buffers"):
        decode(f, lim)
    with pytest.raises(CodecError, match="buffers"):
        decode(struct.pack("<BBHI", 1, 0, 0xFFFF, 1) + b"\xc0")


def test_declared_lengths_beyond_the_frame():
    body = msgpack.packb(msgpack.ExtType(0, struct.pack("<I", 0)))
    good = frame(body, (b"0123456789",))
    assert decode(good) == b"0123456789"
    hdr = struct.pack("<BBHI", 1, 0, 1, len(body))
    with pytest.raises(CodecError, match="beyond"):
        decode(hdr + struct.pack("<Q", 2**64 - 1) + good[16:])
    with pytest.raises(CodecError, match="beyond"):
        decode(hdr + struct.pack("<Q", 11) + good[16:])
    with pytest.raises(CodecError, match="trailing"):
        decode(good + b"x")
    with pytest.raises(CodecError):
        decode(struct.pack("<BBHI", 1, 0, 0, 2**32 - 1) + b"\x90")
    with pytest.raises(CodecError):
        decode(struct.pack("<BBHI", 1, 0, 3, 2**32 - 1) + b"\x90")


@pytest.mark.parametrize(
    "body",
    [
        b"\xdd\xff\xff\xff\xff" + b"\x00" * 5,  # array32 claiming 2**32-1 items
        b"\xdf\xff\xff\xff\xff" + b"\x00" * 5,  # map32
        b"\xdc\xff\xff" + b"\x00" * 5,  # array16
        b"\xdb\xff\xff\xff\xff" + b"a" * 5,  # str32
        b"\xc6\xff\xff\xff\xff" + b"a" * 5,  # bin32
        b"\xc9\xff\xff\xff\xff\x05" + b"a" * 5,  # ext32
        b"\x91" * 20 + b"\xdd\x00\x0f\x42\x40",  # a million items, nested
    ],
)
def test_huge_declared_lengths_fail_fast_without_allocating(body):
    tracemalloc.start()
    try:
        with pytest.raises(CodecError):
            decode(frame(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024


def test_depth_bomb_of_100000_nested_arrays():
    with pytest.raises(CodecError):
        decode(frame(b"\x91" * 100_000 + b"\xc0"))
    with pytest.raises(CodecError):
        decode(frame(b"\x81\xa1k" * 100_000 + b"\xc0"))


def test_depth_limit_is_exact():
    def nested(n):
        v: list = []
        for _ in range(n - 1):
            v = [v]
        return v

    assert rt(nested(32)) == nested(32)
    with pytest.raises(CodecError, match="deep"):
        decode(frame(msgpack.packb(nested(33))))
    with pytest.raises(CodecError, match="deep"):
        encode(nested(33))
    lim = Limits(max_depth=3)
    assert rt({"a": [[1]]}, lim) == {"a": [[1]]}
    with pytest.raises(CodecError):
        decode(frame(msgpack.packb({"a": [[[1]]]})), lim)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(CodecError):
        encode(cyclic)


def test_item_and_string_limits():
    lim = Limits(max_items=10, max_str=20)
    assert rt(list(range(10)), lim) == list(range(10))
    for bad in (list(range(11)), {i: i for i in range(11)}):
        with pytest.raises(CodecError):
            decode(encode_bytes(bad), lim)
        with pytest.raises(CodecError):
            encode(bad, lim)
    with pytest.raises(CodecError):
        decode(encode_bytes("é" * 11), lim)  # 22 bytes of UTF-8
    with pytest.raises(CodecError):
        decode(encode_bytes(b"b" * 21), lim)
    with pytest.raises(CodecError):
        encode(["x" * 25], lim)
    with pytest.raises(CodecError):
        encode({"k": b"b" * 25}, lim)


def test_limits_validation():
    with pytest.raises(ValueError):
        Limits(max_buffers=70000)
    with pytest.raises(ValueError):
        Limits(max_depth=-1)


@pytest.mark.parametrize("bad", [object(), 1 + 2j, range(3), Exception("x"), lambda: 1, sys.stdout])
def test_unsupported_types_are_named_with_what_to_do(bad):
    with pytest.raises(CodecError, match=type(bad).__name__ + ".*lattica.values.register"):
        encode({"value": [bad]})


@pytest.mark.parametrize("key", [(1, 2), 1.5, None, True])
def test_unsupported_map_keys(key):
    with pytest.raises(CodecError, match="key"):
        encode({key: 1})


def test_malformed_frames():
    short = b"\x01\x00\x00\x00\x00\x00\x00"
    for bad in [
        b"",
        b"\x01",
        short,
        frame(b"\xc0", version=2),
        frame(b"\xc0", flags=2),
        frame(b"\x92\xd4\x03\x00\x01"),
    ]:
        with pytest.raises(CodecError):
            decode(bad)
    bodies = [b"", b"\xc1", b"\x92\x01", b"\x01\x02", b"\xa2\xff\xfe", b"\x81\x91\x01\x02"]
    for body in bodies + [b"\x81\x80\x02"]:
        with pytest.raises(CodecError):
            decode(frame(body))
    with pytest.raises(CodecError):
        decode("not bytes")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        decode(12345)  # type: ignore[arg-type]


def test_extension_type_errors():
    for body in [
        ext(0, b"\0\0\0\0"),  # buffer reference without buffers
        ext(0, b"\0\0"),  # short reference
        ext(5, b""),  # reserved codec code
        ext(99, b"\xc0"),  # unregistered code
        b"\xd4\xfbx",  # fixext 1 with a negative (msgpack-reserved) code
        ext(2, b""),
        ext(2, b"\x03<f4\0\0"),  # scalar with wrong size
        ext(2, b"\x02|O" + b"\0" * 8),
        ext(1, b"\0" * 4),  # truncated array header
        ext(1, struct.pack("<BBHI", 40, 3, 0, 0xFFFFFFFF)),  # too many dimensions
        ext(1, struct.pack("<BBHI", 1, 3, 7, 0xFFFFFFFF) + b"\0" * 16),  # reserved bits set
        ext(1, array_payload(b"<f4", (2,), index=3)),  # missing buffer
    ]:
        with pytest.raises(CodecError):
            decode(frame(body))


def test_msgpack_timestamp_extension_decodes_to_int():
    assert decode(frame(b"\xd6\xff\x00\x00\x00\x01")) == 1_000_000_000


# -- extension types -------------------------------------------------------------------------------


def test_peer_id_and_multiaddr_round_trip():
    ma = Multiaddr(f"/ip4/10.0.0.1/udp/4001/quic-v1/p2p/{PID}")
    value = {"peer": PID, "addrs": [ma, Multiaddr("/ip6/::1/tcp/80")], PID: "keyed by peer"}
    out = rt(value)
    assert out == value
    assert type(out["peer"]) is PeerId and type(out["addrs"][0]) is Multiaddr
    assert rt(PID) == PID and rt(ma) == ma


@pytest.mark.parametrize(
    "body",
    [
        ext(16, b"\xc4\x03abc"),  # not a multihash
        ext(16, msgpack.packb(2**40)),  # an int where bytes belong: must not allocate 1 TiB
        ext(16, msgpack.packb([1, 2])),
        ext(16, b"\xc4\x05ab"),  # truncated inner bin
        ext(16, b""),
        ext(17, b"\xc4\x02\xff\xff"),  # unknown multiaddr protocol code
        ext(17, msgpack.packb("not bytes")),
        ext(17, b"\xc4\x01\x04"),  # truncated ip4
    ],
)
def test_broken_extension_payloads(body):
    with pytest.raises(CodecError):
        decode(frame(body))


class Tensor:
    """A test-only extension type whose payload carries an out-of-band buffer and a nested ext."""

    def __init__(self, data: bytes, owner: PeerId, inner: Tensor | None = None) -> None:
        self.data, self.owner, self.inner = data, owner, inner

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and (bytes(self.data), self.owner, self.inner) == (
            bytes(other.data),
            other.owner,
            other.inner,
        )


def _tensor_from(d):
    if not isinstance(d, dict) or set(d) != {"data", "owner", "inner"}:
        raise ValueError("bad tensor")
    return Tensor(d["data"], d["owner"], d["inner"])


def _tensor_to(t):
    return {"data": t.data, "owner": t.owner, "inner": t.inner}


register_ext(100, Tensor, _tensor_to, _tensor_from)


def test_registered_extension_with_buffers_and_nesting():
    t = Tensor(b"t" * MiB, PID, Tensor(b"small", PID))
    chunks = encode({"t": t})
    assert any(c is t.data for c in chunks)  # out of band even inside an extension payload
    f = b"".join(chunks)
    out = decode(f)
    assert out["t"] == t and out["t"].data.obj is f


def test_registered_extension_nesting_is_bounded():
    def chain(n):
        t = None
        for _ in range(n):
            t = Tensor(b"", PID, t)
        return t

    assert rt(chain(8)) == chain(8)
    with pytest.raises(CodecError, match="nested"):
        encode(chain(9))
    with pytest.raises(CodecError, match="nested"):
        encode(chain(9), Limits(max_depth=1000))  # a fixed cap: each level costs C stack


def test_extension_nesting_bomb_is_refused_without_crashing():
    payload = msgpack.packb(b"x")
    for _ in range(5000):
        payload = msgpack.packb(msgpack.ExtType(100, payload))
    for lim in (DEFAULT_LIMITS, Limits(max_depth=100_000)):
        with pytest.raises(CodecError, match="nested"):
            decode(frame(payload), lim)


def test_huge_custom_depth_limit_still_raises_codec_errors():
    lim = Limits(max_depth=100_000)
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(CodecError):
        encode(deep, lim)
    with pytest.raises(CodecError):
        decode(frame(b"\x91" * 5000 + b"\xc0"), lim)


def test_registered_extension_bad_payload():
    with pytest.raises(CodecError, match="Tensor"):
        decode(frame(ext(100, msgpack.packb({"data": 1}))))


def test_register_ext_validation():
    register_ext(100, Tensor, _tensor_to, _tensor_from)  # the same pair again is fine
    with pytest.raises(ValueError):
        register_ext(101, Tensor, lambda t: t, lambda d: d)  # class already has a code
    with pytest.raises(ValueError):
        register_ext(100, dict, lambda t: t, lambda d: d)  # code already taken
    with pytest.raises(ValueError):
        register_ext(1, set, lambda t: t, lambda d: d)  # reserved for the codec
    with pytest.raises(ValueError):
        register_ext(128, set, lambda t: t, lambda d: d)


class Broken:
    pass


def _broken_to(b):
    raise RuntimeError("cannot serialise")


register_ext(101, Broken, _broken_to, lambda d: Broken())


def test_failing_to_obj_is_a_codec_error():
    with pytest.raises(CodecError, match="Broken"):
        encode([Broken()])


class Reentrant:
    def __init__(self, v):
        self.v = v


register_ext(102, Reentrant, lambda r: encode_bytes(r.v), lambda d: Reentrant(decode(d)))


def test_reentrant_encode_from_to_obj():
    out = rt({"r": Reentrant([1, "two", b"3"]), "after": 5})
    assert out["r"].v == [1, "two", b"3"] and out["after"] == 5


# -- threads ---------------------------------------------------------------------------------------


def test_concurrent_use_from_threads():
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(300):
                big = bytes([i]) * (70000 + j)
                msg = {"i": i, "j": j, "arr": np.full(10 + i, j), "big": big, "p": PID}
                out = decode(b"".join(encode(msg)))
                assert out["i"] == i and out["j"] == j and out["p"] == PID
                assert np.array_equal(out["arr"], msg["arr"]) and out["big"] == msg["big"]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_encoder_state_is_released_after_errors():
    big = b"x" * MiB
    with pytest.raises(CodecError):
        encode([big, object()])
    assert rt([1, 2]) == [1, 2]
    assert not codec._local.enc.bufs and not codec._local.enc.busy


def test_a_big_body_may_not_make_millions_of_containers():
    """A few bytes of body make a ~60-byte list object: a body over 64 KiB counts its lists, maps
    and extension values (an extension value counting as 8) against ``max_containers``."""
    import gc

    many = msgpack.packb([[[] for _ in range(700_000)] for _ in range(2)])
    with pytest.raises(CodecError, match="lists and maps"):
        decode(_frame_of(many))
    assert gc.isenabled()  # (paused while decoding, and back on after a refusal too)
    with pytest.raises(CodecError, match="extension values"):
        decode(encode_bytes([PID] * 200_000))  # (each decoded by Python code: ~100 times a list's cost)
    honest = [[i, str(i)] for i in range(200_000)] + [{"k": i} for i in range(100_000)]
    assert decode(encode_bytes(honest)) == honest  # well under the budget: decoded as before
    small = Limits(max_containers=10)
    with pytest.raises(CodecError):
        decode(encode_bytes([[0] * 10 for _ in range(20_000)]), small)


def _frame_of(body: bytes) -> bytes:
    """A codec frame holding ``body`` and no out-of-band buffers."""
    return struct.pack("<BBHI", 1, 0, 0, len(body)) + body
