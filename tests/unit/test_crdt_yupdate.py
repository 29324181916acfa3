"""The Yjs update reader (lattica/crdt/_yupdate.py) against what pycrdt/yrs really writes: the
clock ranges it reads are the ones the writing document's state vector moved by, and anything
malformed is a MalformedUpdate, never another exception."""

from __future__ import annotations

import random

import pycrdt
import pytest

from lattica.crdt._yupdate import read_state_vector, read_update, read_update_as_yrs, write_state_vector
from lattica.errors import MalformedUpdate


def _edit(rnd: random.Random, d: pycrdt.Doc) -> None:
    m = d.get("m", type=pycrdt.Map)
    t = d.get("t", type=pycrdt.Text)
    a = d.get("a", type=pycrdt.Array)
    op = rnd.randrange(7)
    if op == 0:
        m[str(rnd.randrange(5))] = rnd.choice(
            [1, 2.5, "x", None, True, [1, {"a": [1, 2]}], {"k": b"\x00\x01"}, 2**40, -7]
        )
    elif op == 1 and len(m):
        del m[list(m.keys())[0]]
    elif op == 2:
        t.insert(rnd.randrange(len(t) + 1), "ab")
    elif op == 3 and len(t):
        del t[0 : min(2, len(t))]
    elif op == 4:
        a.append(pycrdt.Map({"z": 1}) if rnd.random() < 0.5 else pycrdt.Text("q"))
    elif op == 5 and len(a):
        del a[0]
    else:  # characters beyond ASCII count in UTF-16 units (appended: pycrdt cannot cut inside one)
        u = d.get("u", type=pycrdt.Text)
        u.insert(len(u), rnd.choice(["é", "日本", "😀"]))


@pytest.mark.parametrize("seed", range(20))
def test_ranges_match_the_state_vector(seed):
    rnd = random.Random(seed)
    docs = [
        pycrdt.Doc(client_id=rnd.randrange(1, 2**53), skip_gc=True) for _ in range(3)
    ]  # (a full state of GC'd deletes has GC structs: refused)
    for _ in range(25):
        d = rnd.choice(docs)
        before = d.get_state()
        with d.transaction():
            _edit(rnd, d)
        update = d.get_update(before)
        info = read_update_as_yrs(update)
        sv0, sv1 = read_state_vector(before), read_state_vector(d.get_state())
        assert info.structs == {c: (sv0.get(c, 0), e) for c, e in sv1.items() if e != sv0.get(c, 0)}
        for o in docs:
            if o is not d:
                o.apply_update(update)
    full = read_update(docs[0].get_update())
    assert {c: e for c, (_, e) in full.structs.items()} == read_state_vector(docs[0].get_state())


def test_deletes_are_read():
    d = pycrdt.Doc(client_id=5)
    m = d.get("m", type=pycrdt.Map)
    m["a"], m["b"] = 1, 2
    events = []
    d.observe(lambda e: events.append(e.update))
    del m["a"]
    assert read_update(events[0]).deletes == [(5, 0, 1)] and read_update(events[0]).structs == {}


def test_state_vector_round_trip():
    sv = {1: 0, 2**53 - 1: 7, 300: 2**31}
    assert read_state_vector(write_state_vector(sv)) == sv
    assert write_state_vector({}) == b"\x00"


def test_malformed_updates_are_refused():
    d = pycrdt.Doc(client_id=9)
    d.get("m", type=pycrdt.Map)["k"] = [1, {"x": "y"}]
    good = d.get_update()
    for cut in range(1, len(good)):
        with pytest.raises(MalformedUpdate):
            read_update(good[:cut])
    with pytest.raises(MalformedUpdate):
        read_update(good + b"\x00")  # bytes after the delete set
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x05\x00\x0a\x01\x00")  # a skip struct: a gap
    assert read_update(b"\x01\x01\x05\x00\x00\x03\x00").structs == {
        5: (0, 3)
    }  # a GC struct: content made and deleted at once
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x05\x00\x20\x03\x00")  # a GC kind with flags (yrs would read an item)
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x05\x00\x21\x01\x01m\x01k\x80\x80\x80\x80\x10\x00")  # a deleted length of 2^32
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x85\x00\x00\x00")  # a client id not in its shortest form
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x05\x00\x07\x01\x01x\x05\x00")  # an XML hook (yrs reads no name after it)
    with pytest.raises(MalformedUpdate):
        read_update(b"\x02\x01\x05\x00\x00\x01\x01\x05\x01\x00\x01\x00")  # one client twice
    deep = b"\x75\x01" * 40 + b"\x7e"  # nested lists beyond MAX_DEPTH
    with pytest.raises(MalformedUpdate):
        read_update(b"\x01\x01\x05\x00\x08\x01\x01m\x01" + deep + b"\x00")
    with pytest.raises(MalformedUpdate):
        read_update(b"\xff" * 12)  # a number longer than 64 bits


def test_random_bytes_never_raise_anything_else():
    rnd = random.Random(3)
    d = pycrdt.Doc(client_id=9)
    d.get("m", type=pycrdt.Map)["k"] = "v"
    d.get("t", type=pycrdt.Text).insert(0, "hello")
    good = bytearray(d.get_update())
    for _ in range(3000):
        b = bytearray(good)
        for _ in range(rnd.randrange(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        try:
            read_update(bytes(b))
        except MalformedUpdate:
            pass
        blob = bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
        try:
            read_update(blob)
        except MalformedUpdate:
            pass


def test_transactions_that_make_and_delete_nested_content_are_taken():
    """A nested type written and deleted in one transaction leaves GC structs: honest, taken."""
    d = pycrdt.Doc(client_id=9)
    events = []
    d.observe(lambda e: events.append(e.update))
    with d.transaction():
        arr = d.get("a", type=pycrdt.Array)
        arr.append(pycrdt.Map({"x": 1}))
        arr[0]["y"] = 2
        arr.clear()
    info = read_update_as_yrs(events[0])
    assert set(info.structs) == {9}


def test_what_yrs_reads_differently_is_refused():
    """Bytes this reader could take one way and yrs another (a shared-type byte read as a
    varint here and a byte there): the cross-check catches any such disagreement."""
    d = pycrdt.Doc(client_id=9)
    d.get("m", type=pycrdt.Map)["k"] = "v"
    good = d.get_update()
    assert read_update_as_yrs(good).structs == {9: (0, 1)}
    rnd = random.Random(5)
    refused = 0
    for _ in range(2000):
        b = bytearray(good)
        b[rnd.randrange(len(b))] = rnd.randrange(256)
        try:
            info = read_update_as_yrs(bytes(b))
        except MalformedUpdate:
            refused += 1
            continue
        # taken, and naming nothing an empty document lacks: yrs integrates exactly what we read
        if any(c not in info.structs or k > info.structs[c][1] for c, k in info.needs.items()):
            continue
        doc = pycrdt.Doc()
        doc.apply_update(bytes(b))
        got = read_state_vector(doc.get_state())
        assert {c: e for c, (s, e) in info.structs.items() if s == 0} == {c: e for c, e in got.items() if e}
    assert refused
