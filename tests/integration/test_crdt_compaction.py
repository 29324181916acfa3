"""Compaction between real nodes on loopback (docs/crdt.md, "Compaction"): once a log is long,
a replica proposes a checkpoint, the others check it against their own logs and sign, and every
replica drops the envelopes it covers; a newcomer starts from it; a restart keeps it; and
checkpoints without the signatures they need, or whose state is not what the envelopes make,
are refused."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

import lattica
from helpers import wait_for
from lattica._identity import KeyPair
from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import ActorRef
from lattica.actors.crdt.wire import actor_name
from lattica.config import CrdtConfig, PubSubConfig
from lattica.crdt._checkpoint import Checkpoint, canonical_state
from lattica.errors import LatticaError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"
EVERY = 40


def _node(path, key, **kw):
    cfg = CrdtConfig(path=str(path), compact_every=EVERY, **kw)
    return lattica.Node([TCP], mesh=key, crdt=cfg, pubsub=PubSubConfig(discover=False)).start()


def _write(doc, prefix, n):
    for i in range(n):
        with doc.transaction():
            doc.map("m")[f"{prefix}{i}"] = i
        doc.commit().result(10)  # (one envelope each)


def _replica(node, doc):
    return doc._r


@pytest.fixture
def trio(tmp_path):
    key = MeshKey.generate()
    nodes = [_node(tmp_path / f"n{i}", key) for i in range(3)]
    try:
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                b.connect(a.addrs[0])
        yield key, nodes
    finally:
        for n in nodes:
            n.stop()


def _checkpointed(docs):
    """All replicas took one and the same checkpoint and hold the same content."""
    want = docs[0].to_py()
    stats = [d.stats() for d in docs]
    return (
        all(s["checkpoints"] >= 1 for s in stats)
        and all(d.to_py() == want for d in docs)
        and len({tuple(cp.digest for cp in _replica_of(d).state.checkpoints) for d in docs}) == 1
    )


def _replica_of(doc):
    return doc._r


def test_replicas_compact_a_newcomer_starts_from_the_checkpoint_and_a_restart_keeps_it(trio, tmp_path):
    key, nodes = trio
    docs = [lattica.crdt.open("swarm/log", node=n) for n in nodes]
    wait_for(lambda: all(len(d.peers()) >= 2 for d in docs), timeout=10)
    for i, d in enumerate(docs):  # (EVERY in all: the checkpoint covers every envelope)
        _write(d, f"w{i}-", EVERY // 3 + (i < EVERY % 3))
    assert wait_for(lambda: _checkpointed(docs) and all(d.stats()["log_envelopes"] == 0 for d in docs), timeout=30), [
        d.stats() for d in docs
    ]
    for d in docs:
        assert d.stats()["refused"] == 0, d.stats()
    cp = _replica_of(docs[0]).state.checkpoints[0]
    assert len(cp.valid_signatures()) >= 2  # (the quorum: the proposer and one that checked it)
    want = docs[0].to_py()
    assert len(want["m"]) == EVERY

    # a newcomer lacks what the others dropped: it takes the checkpoint (by its signatures) and
    # what came after it
    late = _node(tmp_path / "late", key)
    try:
        late.connect(nodes[0].addrs[0])
        doc = lattica.crdt.open("swarm/log", node=late)
        # (everything it holds came in the checkpoint's state: it must learn the roots from that)
        assert wait_for(lambda: doc.to_py() == want, timeout=20), (doc.stats(), doc.to_py().keys())
        _write(docs[1], "after-", 3)
        assert wait_for(lambda: doc.to_py() == docs[1].to_py(), timeout=20), (doc.stats(), doc.to_py().keys())
        s = doc.stats()
        assert s["checkpoints"] == 1 and s["checkpoints_taken"] == 1 and s["refused"] == 0, s
        # and goes on writing: the others take its changes
        _write(doc, "late-", 2)
        assert wait_for(lambda: all(d.to_py() == doc.to_py() for d in docs), timeout=20)
    finally:
        late.stop()

    # the store dropped the covered envelopes too, and a restart gives the same state back
    covered = sum(s for _, _, s, _ in cp.heads)
    path = tmp_path / "n2"
    nodes[2].stop()
    with sqlite3.connect(str(path / "crdt.sqlite")) as db:
        rows = db.execute("SELECT COUNT(*) FROM envelopes").fetchone()[0]
        cps = db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert cps == 1 and rows < covered, (rows, covered)
    again = _node(path, key)
    try:
        doc = lattica.crdt.open("swarm/log", node=again)
        assert doc.to_py() == docs[0].to_py()
        assert doc.stats()["checkpoints"] == 1
    finally:
        again.stop()


def _call(node, target, doc, method, *args):
    ref = ActorRef(
        target.peer_id, actor_name(bytes.fromhex(doc.id)), {"sync": ASYNC, "push": ASYNC, "checkpoint": ASYNC}
    )
    return node.host.runtime.call(ref, method, args, {}, timeout=5.0).result(10)


def test_checkpoints_without_the_signatures_they_need_or_with_a_wrong_state_are_refused(trio, tmp_path):
    key, nodes = trio
    host, member, _ = nodes
    docs = [lattica.crdt.open("swarm/guarded", node=n) for n in nodes[:2]]
    wait_for(lambda: all(len(d.peers()) >= 1 for d in docs), timeout=10)
    _write(docs[0], "a", 5)
    assert wait_for(lambda: docs[1].to_py() == docs[0].to_py(), timeout=10)
    state = _replica(host, docs[0]).state
    proposal, canon = state.propose([])
    victim = _replica(host, docs[0])

    def refusals():
        return dict(victim.state.refused_total)

    # one member's signature is not a quorum of two (a stranger's key adds nothing)
    stranger = KeyPair.generate()
    alone = proposal.signed(member.keypair, tuple(member.host.trust.presented)).signed(stranger, ())
    assert _call(member, host, docs[0], "checkpoint", alone.to_bytes(), canon)[0] == []
    assert refusals().get("checkpoint: checkpoint without the signatures it needs") == 1

    # two members' signatures on a state that is not what the envelopes make: a replica holding
    # the envelopes checks it and refuses; nothing is dropped
    other = KeyPair.generate()
    other_certs = (key.issue(other.peer_id).to_bytes(),)
    bogus_state = canonical_state([e.body for e in list(state.log.all())[:-1]])  # (without the last change)
    wrong = Checkpoint(proposal.doc, proposal.heads, hashlib.sha256(bogus_state).digest())
    wrong = wrong.signed(member.keypair, tuple(member.host.trust.presented)).signed(other, other_certs)
    _call(member, host, docs[0], "checkpoint", wrong.to_bytes(), bogus_state)
    assert refusals().get("checkpoint: its state is not what the envelopes it covers make") == 1
    assert victim.state.checkpoints == [] and len(victim.state.log) == 5

    # a newcomer cannot check it: it takes a quorum's word, but not a state that does not match
    # the checkpoint's hash, nor one holding items of chains it does not name
    late = _node(tmp_path / "late", key)
    try:
        late.connect(host.addrs[0])
        fresh = lattica.crdt.open("swarm/guarded-other", node=late)  # (another document: nothing to sync)
        fresh_r = _replica(late, fresh)
        right = (
            Checkpoint(fresh_r.doc, proposal.heads, proposal.state_hash)
            .signed(member.keypair, tuple(member.host.trust.presented))
            .signed(other, other_certs)
        )
        with pytest.raises(LatticaError):
            _call(member, late, fresh, "checkpoint", b"garbage", None)
        _call(member, late, fresh, "checkpoint", right.to_bytes(), bogus_state)
        _call(
            member, late, fresh, "checkpoint", right.to_bytes(), canon
        )  # (the hash is right: the chains are another document's)
        refused = fresh_r.state.refused_total
        assert refused.get("malformed checkpoint") == 1
        assert refused.get("checkpoint: the state is not the one the checkpoint names") == 1
        assert refused.get("checkpoint: the state holds items of a chain it does not cover") == 1
        assert fresh_r.state.checkpoints == [] and fresh.to_py() == {}
    finally:
        late.stop()

    # the real one, signed by the quorum, is taken by a replica that lacks nothing (checked)
    good = proposal.signed(member.keypair, tuple(member.host.trust.presented)).signed(other, other_certs)
    _call(member, host, docs[0], "checkpoint", good.to_bytes(), None)
    assert wait_for(
        lambda: victim.state.checkpoints == [good] or [c.digest for c in victim.state.checkpoints] == [good.digest],
        timeout=5,
    )
    assert len(victim.state.log) == 0 and docs[0].to_py() == docs[1].to_py()


def test_an_owner_document_is_compacted_by_its_owner_alone(trio):
    key, nodes = trio
    owner, writer, _ = nodes
    mine = lattica.crdt.open("run/7", node=owner, owner=True, writers=[writer.peer_id])
    theirs = lattica.crdt.open("run/7", node=writer, owner=owner.peer_id)
    assert wait_for(lambda: writer.peer_id in theirs.writers, timeout=10)
    _write(theirs, "t", EVERY // 2)
    _write(mine, "o", EVERY // 2 + 1)
    assert wait_for(lambda: _checkpointed([mine, theirs]), timeout=30), (mine.stats(), theirs.stats())
    cp = _replica_of(theirs).state.checkpoints[0]
    assert [s.signer for s in cp.valid_signatures()] == [owner.peer_id.to_bytes()]
    _write(theirs, "more", 2)
    assert wait_for(lambda: mine.to_py() == theirs.to_py(), timeout=10)


def test_sync_answers_to_one_peer_are_bounded_in_bytes_per_second(trio):
    """What one peer may have a replica send it (a summary of nothing asks for everything):
    answers go into a per-peer byte budget, and once it is spent the next sync is refused."""
    from lattica._budget import Buckets
    from lattica.errors import PermissionDenied

    key, nodes = trio
    a, b, _ = nodes
    docs = [lattica.crdt.open("swarm/bytes", node=n) for n in (a, b)]
    wait_for(lambda: all(len(d.peers()) >= 1 for d in docs), timeout=10)
    _write(docs[0], "k", 10)
    replica = _replica(a, docs[0])
    replica._sync_bytes = Buckets(100.0, 3000.0, 16)  # (the real budget is 16 MiB/s, 64 MiB at once)
    first = _call(b, a, docs[0], "sync", [])
    assert len(first[1]) == 10  # ~3 KB: spent (into debt)
    with pytest.raises(PermissionDenied, match="more of"):
        _call(b, a, docs[0], "sync", [])


def test_a_newcomer_takes_a_checkpoint_whose_state_is_large(trio, tmp_path):
    """A state of 64 KiB or more travels out of band (it arrives as a view of the frame, not as
    bytes): a newcomer still takes it."""
    key, nodes = trio
    docs = [lattica.crdt.open("swarm/big", node=n) for n in nodes[:2]]
    wait_for(lambda: all(len(d.peers()) >= 1 for d in docs), timeout=10)
    with docs[0].transaction():
        docs[0].text("blob").insert(0, "x" * 200_000)
    docs[0].commit().result(10)
    _write(docs[0], "a", EVERY // 2 - 1)
    _write(docs[1], "b", EVERY // 2)
    assert wait_for(lambda: _checkpointed(docs) and all(d.stats()["log_envelopes"] == 0 for d in docs), timeout=30), [
        d.stats() for d in docs
    ]
    assert len(next(iter(_replica_of(docs[0]).cp_states.values()))) > 200_000
    late = _node(tmp_path / "late", key)
    try:
        late.connect(nodes[0].addrs[0])
        doc = lattica.crdt.open("swarm/big", node=late)
        assert wait_for(lambda: doc.to_py() == docs[0].to_py(), timeout=20), doc.stats()
        assert doc.stats()["checkpoints_taken"] == 1 and doc.stats()["refused"] == 0
    finally:
        late.stop()


def test_a_signature_answer_out_of_bounds_is_a_protocol_error():
    from lattica.actors.crdt.wire import parse_signatures as _parse_signatures
    from lattica.errors import ProtocolError

    keys = KeyPair.generate()
    good = [keys.peer_id.to_bytes(), 1, [], bytes(64)]
    assert len(_parse_signatures([[good], []])) == 1
    for bad in (
        [keys.peer_id.to_bytes(), 1, [b"c" * 70_000], bytes(64)],  # (a certificate too long to sign over)
        [b"x" * 100, 1, [], bytes(64)],
        [keys.peer_id.to_bytes(), 1, [], bytes(10)],
        [keys.peer_id.to_bytes(), -1, [], bytes(64)],
    ):
        with pytest.raises(ProtocolError):
            _parse_signatures([[bad], []])
