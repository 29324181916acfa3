"""The ``checkpoints`` store: newest copy wins, bounded per writer and in total, expires, refuses
malformed input, unsigned copies and far-future stamps, and serves a copy only to its writer
(or an administrator, or anyone once the writer is down); and the rendezvous ranking writer and
reader agree on."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from lattica._identity import KeyPair
from lattica._runtime import refs
from lattica.actors import supervisor as cp
from lattica.errors import CheckpointRejected

NODE, A, B, C = (KeyPair.generate() for _ in range(4))


class _Runtime(SimpleNamespace):
    """The store's view of its node (``NODE``): who administers the mesh, which nodes are down;
    ``key``: the calling writer's key."""

    def __init__(self) -> None:
        super().__init__(peer_id=NODE.peer_id, key=A, admins=set(), down=set())
        self.host = SimpleNamespace(is_admin=lambda p: p in self.admins)

    def node_gone(self, p) -> bool:
        return p in self.down


@pytest.fixture(autouse=True)
def _caller():
    token = refs.CALLER.set(A.peer_id)  # calls come from A unless a test says otherwise
    yield
    refs.CALLER.reset(token)


def _store(**kw) -> cp.CheckpointStore:
    return cp.CheckpointStore(_Runtime(), **kw)  # type: ignore[arg-type]


def as_writer(s, kp) -> None:
    s._rt.key = kp
    refs.CALLER.set(kp.peer_id)


def keep(s, name, stamp, blob, signature=None):
    signature = cp.sign_copy(s._rt.key, name, stamp, blob) if signature is None else signature
    return run(s.keep(name, stamp, blob, signature, []))


def fetched(s, name):
    """(stamp, blob) of the newest copy of ``name`` the caller may read, or None."""
    got = run(s.fetch(name))
    return tuple(got[0][:2]) if got else None


def run(coro):
    return asyncio.run(coro)


def test_the_newest_copy_wins_and_an_older_one_is_refused():
    s = _store()
    assert keep(s, "sup/w0", 2.0, b"two") is True
    assert keep(s, "sup/w0", 1.0, b"one") is False  # a late, older copy
    assert fetched(s, "sup/w0") == (2.0, b"two")
    assert keep(s, "sup/w0", 3.0, b"three!") is True
    assert fetched(s, "sup/w0") == (3.0, b"three!") and s.total == 6
    got = run(s.fetch("sup/w0"))
    assert [c[:3] for c in cp.read_copies(got, "sup/w0")] == [(3.0, b"three!", A.peer_id)]  # signed by its writer
    run(s.drop("sup/w0"))
    assert run(s.fetch("sup/w0")) == [] and s.total == 0


def test_byte_limits_per_writer_and_in_total():
    s = _store(max_bytes=100, max_per_writer=60)
    keep(s, "a", 1.0, bytes(50))
    with pytest.raises(CheckpointRejected, match="one peer"):
        keep(s, "b", 1.0, bytes(20))
    assert keep(s, "a", 2.0, bytes(60)) is True  # replacing its own copy frees its bytes
    as_writer(s, B)
    keep(s, "b", 1.0, bytes(40))
    with pytest.raises(CheckpointRejected, match="maximum"):
        keep(s, "c", 1.0, bytes(1))
    assert s.total == 100


def test_copies_expire_an_hour_after_the_last_write(monkeypatch):
    s = _store()
    now = [1000.0]
    monkeypatch.setattr(cp.time, "monotonic", lambda: now[0])
    keep(s, "a", 1.0, b"x")
    now[0] += cp.EXPIRY + 1
    assert run(s.fetch("a")) == [] and s.total == 0


@pytest.mark.parametrize(
    "args",
    [
        ("", 1.0, b"x"),
        ("a" * 600, 1.0, b"x"),
        ("a", 1, b"x"),
        ("a", 1.0, "x"),
        (None, 1.0, b"x"),
        ("a", float("inf"), b"x"),
        ("a", float("nan"), b"x"),
        ("a", 1e308, b"x"),
        ("a", -1.0, b"x"),
    ],
)
def test_malformed_keeps_and_impossible_stamps_are_refused(args):
    with pytest.raises(CheckpointRejected):
        run(_store().keep(*args, bytes(64), []))


def test_a_copy_not_signed_by_the_sender_is_refused():
    s = _store()
    with pytest.raises(CheckpointRejected, match="not signed"):
        keep(s, "a", 1.0, b"x", signature=cp.sign_copy(B, "a", 1.0, b"x"))  # B's signature, sent by A
    with pytest.raises(CheckpointRejected, match="not signed"):
        keep(s, "a", 1.0, b"x", signature=cp.sign_copy(A, "a", 2.0, b"x"))  # another stamp
    assert keep(s, "a", time.time() + 60, b"x")  # a little ahead (clocks differ) is fine


def test_each_writer_has_its_own_slot_and_reads_or_drops_only_its_own_while_others_live():
    """Another member's copy under the same name never replaces the writer's (it cannot squat a
    name ahead of its real writer either); it cannot read or drop the writer's copy while the
    writer lives; an administrator, or anyone once the writer is down, can."""
    s = _store()
    as_writer(s, B)
    assert keep(s, "sup/w0", 5.0, b"squatted first") is True  # before the real writer
    as_writer(s, A)
    assert keep(s, "sup/w0", 1.0, b"honest") is True  # its own slot: not blocked, not replaced
    assert fetched(s, "sup/w0") == (1.0, b"honest")  # A reads only its own
    as_writer(s, B)
    assert fetched(s, "sup/w0") == (5.0, b"squatted first")
    assert keep(s, "sup/w0", 6.0, b"poison") is True and s.copies == 2
    as_writer(s, C)
    for attempt in (lambda: run(s.fetch("sup/w0")), lambda: run(s.drop("sup/w0"))):
        with pytest.raises(CheckpointRejected, match="writers are alive"):
            attempt()
    s._rt.admins.add(C.peer_id)  # an administrator reads every copy, newest first
    assert [c[:2] for c in run(s.fetch("sup/w0"))] == [[6.0, b"poison"], [1.0, b"honest"]]
    s._rt.admins.clear()
    s._rt.down.add(A.peer_id)  # A's node died: its supervisor, restarted elsewhere, reads A's copy
    assert fetched(s, "sup/w0") == (1.0, b"honest")
    run(s.drop("sup/w0"))  # and drops only what it may
    assert s.copies == 1
    with pytest.raises(CheckpointRejected):  # B's is left, and B lives
        fetched(s, "sup/w0")
    as_writer(s, B)
    assert fetched(s, "sup/w0") == (6.0, b"poison")


def test_a_fetched_copy_is_believed_only_with_its_writers_signature():
    s = _store()
    keep(s, "sup/w0", 1.0, b"state")
    ((stamp, blob, writer, sig, certs),) = run(s.fetch("sup/w0"))
    assert cp.read_copy([stamp, blob, writer, sig, certs], "sup/w0") is not None
    assert cp.read_copy([stamp, b"forged", writer, sig, certs], "sup/w0") is None  # the holder altered it
    assert cp.read_copy([stamp, blob, B.peer_id.to_bytes(), sig, certs], "sup/w0") is None  # or its writer
    assert cp.read_copy([stamp, blob, writer, sig, certs], "sup/w1") is None  # or its name
    assert cp.read_copy([stamp, blob], "sup/w0") is None


def test_writer_and_reader_rank_members_the_same_way():
    members = [f"peer-{i}" for i in range(10)]
    order = cp.ranked("sup/w0", members)
    assert sorted(order) == sorted(members)
    assert cp.ranked("sup/w0", list(reversed(members))) == order  # independent of view order
    assert cp.ranked("sup/w1", members) != order  # names spread over the nodes
    # a member joining or leaving moves no other member's place
    assert [m for m in cp.ranked("sup/w0", members + ["new"]) if m != "new"] == order


def test_a_restoring_supervisor_prefers_copies_from_writers_it_can_trust():
    """Admins, this node and nodes controlling the supervisor rank above plain members whose
    node is gone (the node an invited previous incarnation ran on), strangers and live plain
    members are never believed."""
    from lattica.supervisor import Supervisor
    from lattica.trust import MeshKey, Trust

    mesh = MeshKey.generate()
    me, admin, member, stranger = (KeyPair.generate() for _ in range(4))
    sup = Supervisor.cls.__new__(Supervisor.cls)
    sup._me = SimpleNamespace(name="sup")
    gone: set = set()
    sup._rt = SimpleNamespace(
        peer_id=me.peer_id,
        host=SimpleNamespace(
            trust=Trust(me.peer_id, [mesh.public]),
            services=SimpleNamespace(spawner=SimpleNamespace(controls=lambda name, peer: False)),  # it owns no one
        ),
        node_gone=gone.__contains__,
    )
    now = time.time()
    assert sup._trust_in_writer(me.peer_id, []) == 2
    assert sup._trust_in_writer(admin.peer_id, [mesh.issue(admin.peer_id, 60, now, admin=True).to_bytes()]) == 2
    # a plain member's copy: believed once its node is gone (a live one may have made it up)
    assert sup._trust_in_writer(member.peer_id, [mesh.issue(member.peer_id, 60, now).to_bytes()]) == 0
    gone.add(member.peer_id)
    assert sup._trust_in_writer(member.peer_id, [mesh.issue(member.peer_id, 60, now).to_bytes()]) == 1
    assert sup._trust_in_writer(stranger.peer_id, [MeshKey.generate().issue(stranger.peer_id, 60, now).to_bytes()]) == 0
    assert (
        sup._trust_in_writer(stranger.peer_id, [mesh.issue(member.peer_id, 60, now).to_bytes()]) == 0
    )  # another's certificate
