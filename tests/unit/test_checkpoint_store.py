"""The ``checkpoints`` store: newest copy wins, bounded per writer and in total, expires, refuses
malformed input; and the rendezvous ranking writer and reader agree on."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from lattica.actors import checkpoints as cp
from lattica.errors import CheckpointRejected


def _store(**kw) -> cp.CheckpointStore:
    return cp.CheckpointStore(SimpleNamespace(peer_id="writer-a"), **kw)  # type: ignore[arg-type]


def run(coro):
    return asyncio.run(coro)


def test_the_newest_copy_wins_and_an_older_one_is_refused():
    s = _store()
    assert run(s.keep("sup/w0", 2.0, b"two")) is True
    assert run(s.keep("sup/w0", 1.0, b"one")) is False  # a late, older copy
    assert run(s.fetch("sup/w0")) == [2.0, b"two"]
    assert run(s.keep("sup/w0", 3.0, b"three!")) is True
    assert run(s.fetch("sup/w0")) == [3.0, b"three!"] and s.total == 6
    run(s.drop("sup/w0"))
    assert run(s.fetch("sup/w0")) is None and s.total == 0


def test_byte_limits_per_writer_and_in_total():
    s = _store(max_bytes=100, max_per_writer=60)
    run(s.keep("a", 1.0, bytes(50)))
    with pytest.raises(CheckpointRejected, match="one peer"):
        run(s.keep("b", 1.0, bytes(20)))
    assert run(s.keep("a", 2.0, bytes(60))) is True  # replacing its own copy frees its bytes
    s._rt.peer_id = "writer-b"
    run(s.keep("b", 1.0, bytes(40)))
    with pytest.raises(CheckpointRejected, match="maximum"):
        run(s.keep("c", 1.0, bytes(1)))
    assert s.total == 100


def test_copies_expire_an_hour_after_the_last_write(monkeypatch):
    s = _store()
    now = [1000.0]
    monkeypatch.setattr(cp.time, "monotonic", lambda: now[0])
    run(s.keep("a", 1.0, b"x"))
    now[0] += cp.EXPIRY + 1
    assert run(s.fetch("a")) is None and s.total == 0


@pytest.mark.parametrize("args", [("", 1.0, b"x"), ("a" * 600, 1.0, b"x"), ("a", 1, b"x"), ("a", 1.0, "x"), (None, 1.0, b"x")])
def test_malformed_keeps_are_refused(args):
    with pytest.raises(CheckpointRejected):
        run(_store().keep(*args))


def test_writer_and_reader_rank_members_the_same_way():
    members = [f"peer-{i}" for i in range(10)]
    order = cp.ranked("sup/w0", members)
    assert sorted(order) == sorted(members)
    assert cp.ranked("sup/w0", list(reversed(members))) == order  # independent of view order
    assert cp.ranked("sup/w1", members) != order  # names spread over the nodes
    # a member joining or leaving moves no other member's place
    assert [m for m in cp.ranked("sup/w0", members + ["new"]) if m != "new"] == order
