"""The pure half of spilling: which values go by CID, their placeholders on the wire, and a
placeholder a peer made up (wrong size, dtype or shape) refused before anything is rebuilt."""

import numpy as np
import pytest

from lattica import codec
from lattica._runtime import spill
from lattica._runtime.spill import SPILL_FROM, Spilled, placeholders, restore
from lattica.errors import CodecError


def test_big_buffers_in_containers_are_spilled_and_put_back():
    stored = {}

    def put(data):
        cid = f"cid{len(stored)}"
        stored[cid] = bytearray(data)
        return cid

    arr = np.arange(SPILL_FROM, dtype=np.int32).reshape(2, -1)
    value = [arr, (b"x" * SPILL_FROM, 3), {"k": bytearray(SPILL_FROM), "small": b"s"}, memoryview(b"m" * SPILL_FROM)]
    out, cids = spill.spill(value, put, limit=1 << 30)
    assert len(cids) == 4 and type(out[1]) is tuple and out[2]["small"] == b"s" and out[1][1] == 3
    wire = codec.decode(codec.encode_bytes(out))  # (placeholders travel as codec extension 22)
    found = placeholders(wire)
    assert [s.kind for s in found] == ["ndarray", "bytes", "bytearray", "bytes"]
    back = restore(wire, {id(s): s.rebuild(stored[s.cid]) for s in found})
    assert np.array_equal(back[0], arr) and back[0].flags.writeable and back[1][0] == b"x" * SPILL_FROM
    assert type(back[2]["k"]) is bytearray and back[3] == b"m" * SPILL_FROM


def test_nothing_big_nothing_spilled_and_the_bound_holds():
    with pytest.raises(CodecError):
        spill.spill([b"small", np.zeros(4)], lambda d: "x", limit=1 << 30)
    with pytest.raises(ValueError, match="spill_limit"):
        spill.spill([b"x" * SPILL_FROM, b"y" * SPILL_FROM], lambda d: "x", limit=SPILL_FROM + 1)


def test_a_made_up_placeholder_is_refused():
    with pytest.raises(ValueError, match="announced"):
        Spilled("c", "bytes", 10).rebuild(bytearray(9))
    for dtype in ("|O", "", "not a dtype", "V8"):
        with pytest.raises(ValueError, match="dtype"):
            Spilled("c", "ndarray", 8, dtype, (1,)).rebuild(bytearray(8))
    with pytest.raises(ValueError, match="shape"):
        Spilled("c", "ndarray", 8, "<i4", (3,)).rebuild(bytearray(8))
    for bad in (
        [1, "bytes", 1, "", []],
        ["c", "pickle", 1, "", []],
        ["c", "bytes", -1, "", []],
        ["c", "ndarray", 4, "<i4", [-1]],
        "x",
    ):
        with pytest.raises(CodecError):
            spill._from_obj(bad)  # (what decoding extension 22 from a peer calls)
