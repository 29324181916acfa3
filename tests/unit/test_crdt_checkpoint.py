"""Checkpoints (lattica/crdt/checkpoint.py and the replica's rules for them), sans-IO: real
pycrdt updates in really signed envelopes; a checkpoint is computed, checked by another replica
from its own log, taken (its envelopes dropped) and given to a newcomer."""

from __future__ import annotations

import hashlib
import random

import pycrdt
import pytest

from lattica.crdt.checkpoint import Checkpoint, Signature, canonical_state, check_state
from lattica.crdt.envelope import doc_id
from lattica.crdt.replica import ReplicaState
from lattica.errors import MalformedUpdate
from lattica.identity import KeyPair
from test_crdt_replica import DOC, Writer, apply


def _history(n: int = 30, seed: int = 1) -> tuple[list[Writer], list]:
    """Three writers editing one map and one text, each learning the others' changes at once."""
    rng = random.Random(seed)
    ws = [Writer() for _ in range(3)]
    envs = []
    for step in range(n):
        w = rng.choice(ws)

        def edit(d, step=step):
            d.get("m", type=pycrdt.Map)[str(rng.randint(0, 5))] = step
            t = d.get("t", type=pycrdt.Text)
            if len(t) > 4 and rng.random() < 0.3:
                del t[0:2]
            else:
                t.insert(rng.randint(0, len(t)), "ab")

        env = w.change(edit)
        envs.append(env)
        for o in ws:
            if o is not w:
                o.learn([env])
    return ws, envs


def _replica(envs) -> tuple[ReplicaState, pycrdt.Doc]:
    r, ydoc = ReplicaState(DOC, None), pycrdt.Doc()
    out = r.receive(envs)
    assert not out.refused and r.held() == 0
    apply(ydoc, out)
    return r, ydoc


def _content(ydoc: pycrdt.Doc) -> tuple:
    return ydoc.get("m", type=pycrdt.Map).to_py(), str(ydoc.get("t", type=pycrdt.Text))


def test_the_canonical_state_is_the_same_for_any_order_and_split():
    _, envs = _history(40)
    bodies = [e.body for e in envs]
    one = canonical_state(bodies)
    rng = random.Random(2)
    for _ in range(10):
        shuffled = bodies[:]
        rng.shuffle(shuffled)
        cut = rng.randint(1, len(bodies) - 1)
        assert canonical_state(shuffled) == one
        assert canonical_state([canonical_state(shuffled[:cut]), *shuffled[cut:]]) == one
        # two overlapping parts merged, as two checkpoints made apart are
        assert canonical_state([canonical_state(shuffled[:cut + 5]), canonical_state(shuffled[cut:])]) == one


def test_a_checkpoint_round_trips_and_its_signatures_verify():
    ws, envs = _history(10)
    r, _ = _replica(envs)
    cp, _ = r.propose([])
    keys, other = KeyPair.generate(), KeyPair.generate()
    signed = cp.signed(keys).signed(other, certs=(b"cert",))
    again = Checkpoint.from_bytes(signed.to_bytes())
    assert again == signed and again.digest == cp.digest
    assert {s.signer for s in again.valid_signatures()} == {keys.peer_id.to_bytes(), other.peer_id.to_bytes()}
    assert signed.signed(keys) is signed  # once per signer
    forged = Checkpoint(cp.doc, cp.heads, cp.state_hash, (Signature(other.peer_id.to_bytes(), 1, (), bytes(64)),))
    assert forged.valid_signatures() == []
    # a signature is for one checkpoint: moved to another (a different state), it does not verify
    moved = Checkpoint(cp.doc, cp.heads, bytes(32), signed.signatures)
    assert moved.valid_signatures() == []
    assert cp.with_signatures(list(signed.signatures) * 2).signatures == signed.signatures


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x94\x01\x02\x03\x04", bytes(10)])
def test_malformed_checkpoints_are_refused(raw):
    with pytest.raises(MalformedUpdate):
        Checkpoint.from_bytes(raw)


def test_unsorted_or_repeated_heads_are_refused():
    ws, envs = _history(10)
    cp, _ = _replica(envs)[0].propose([])
    for heads in (tuple(reversed(cp.heads)), cp.heads + cp.heads[:1]):
        with pytest.raises(MalformedUpdate):
            Checkpoint.from_bytes(Checkpoint(cp.doc, heads, cp.state_hash).to_bytes())


def test_a_replica_checks_a_checkpoint_from_its_own_log_and_drops_what_it_covers():
    ws, envs = _history(30)
    a, doc_a = _replica(envs)
    shuffled = envs[:]
    random.Random(5).shuffle(shuffled)
    b, doc_b = _replica(shuffled)  # (applied in another order: the same canonical state)
    cp, canon = a.propose([])
    assert b.check(cp, []) == ("", canon)
    why, out = b.adopt(cp, canon)
    assert why == "" and not out.applied
    assert len(b.log) == 0 and b.base == cp.covers()
    assert b.summary() == a.summary()
    again = b.receive(envs)  # what the checkpoint covers is settled: counted as duplicates
    assert again.duplicates == len(envs) and not again.applied and not again.refused
    assert b.missing_for({}) == [] and b.checkpoints_for({}) == [cp]
    assert b.checkpoints_for(a.summary()) == []
    # later changes apply on top, and the next checkpoint covers the first one's state and them
    more = [ws[0].set("after", 1)]
    for o in ws[1:]:
        o.learn(more)
    more.append(ws[1].set("after2", 2))
    apply(doc_b, b.receive(more))
    assert [e.seq for e in b.missing_for(cp.covers())] == [e.seq for e in more]
    cp2, canon2 = b.propose([canon])
    apply(doc_a, a.receive(more))
    assert a.check(cp2, []) == ("", canon2)  # (a never took the first: it checks from its whole log)
    assert b.adopt(cp2, canon2)[0] == "" and b.checkpoints == [cp2] and len(b.log) == 0


def test_a_newcomer_starts_from_a_checkpoint_and_takes_what_came_after():
    ws, envs = _history(30)
    a, doc_a = _replica(envs)
    cp, canon = a.propose([])
    a.adopt(cp, canon)
    later = [ws[2].change(lambda d: d.get("t", type=pycrdt.Text).insert(0, "zz"))]
    for o in ws[:2]:
        o.learn(later)
    later.append(ws[0].change(lambda d: d.get("m", type=pycrdt.Map).pop("1", None) or d.get("m", type=pycrdt.Map).__setitem__("k", 9)))
    apply(doc_a, a.receive(later))
    new, doc_new = ReplicaState(DOC, None), pycrdt.Doc()
    for given in a.checkpoints_for(new.summary()):
        why, out = new.adopt(given, canon)
        assert why == ""
        doc_new.apply_update(canon)
    out = new.receive(a.missing_for(new.summary()))
    assert not out.refused and new.held() == 0
    apply(doc_new, out)
    assert _content(doc_new) == _content(doc_a) and new.summary() == a.summary()
    # envelopes that waited for what the checkpoint covers apply once it is taken
    late, doc_late = ReplicaState(DOC, None), pycrdt.Doc()
    held = late.receive(later)
    assert held.held == len(later) and not held.applied
    why, out = late.adopt(cp, canon)
    assert why == "" and [e.id for e in out.applied] == [e.id for e in later]


def test_a_checkpoint_that_is_not_what_its_envelopes_make_is_refused():
    ws, envs = _history(20)
    a, _ = _replica(envs)
    b, _ = _replica(envs)
    cp, canon = a.propose([])
    wrong = Checkpoint(cp.doc, cp.heads, hashlib.sha256(canon + b"x").digest())
    assert b.check(wrong, [])[0] == "its state is not what the envelopes it covers make"
    # a state that leaves out a writer's last change: its hash is not the checkpoint's, and a
    # checkpoint made for it (heads claiming that change) is refused by whoever holds it
    partial = canonical_state([e.body for e in envs[:-1]])
    assert check_state(cp, partial)[0] == "the state is not the one the checkpoint names"
    lying = Checkpoint(cp.doc, cp.heads, hashlib.sha256(partial).digest())
    assert b.check(lying, [])[0] == "its state is not what the envelopes it covers make"
    assert b.adopt(lying, partial)[0] == "its state is behind envelopes we hold"
    # a state holding items of a chain the checkpoint does not cover
    stranger = Writer()
    extra = canonical_state([canon, stranger.set("x", 1).body])
    foreign = Checkpoint(cp.doc, cp.heads, hashlib.sha256(extra).digest())
    assert check_state(foreign, extra)[0] == "the state holds items of a chain it does not cover"
    assert ReplicaState(DOC, None).adopt(foreign, extra)[0] == "the state holds items of a chain it does not cover"
    # for another document
    other = Checkpoint(doc_id("other", None), cp.heads, cp.state_hash)
    assert b.check(other, [])[0] == "another document"
    assert b.adopt(other, canon)[0] == "another document"


def test_a_replica_lacking_what_a_checkpoint_covers_cannot_check_it():
    ws, envs = _history(20)
    a, _ = _replica(envs)
    cp, _ = a.propose([])
    b = ReplicaState(DOC, None)
    b.receive(envs[:10])
    assert b.check(cp, [])[0] == "we do not hold everything it covers"


def test_a_state_behind_envelopes_held_is_refused():
    ws, envs = _history(20)
    a, _ = _replica(envs[:10])
    cp, canon = a.propose([])  # covers the first ten
    b, _ = _replica(envs)
    # b is ahead on every chain: taking it is fine (nothing of b's goes back)
    assert b.adopt(cp, canon)[0] == ""
    # a checkpoint that claims more of a chain than its state holds is refused by one that holds
    # that much (one that does not can only trust its signers: docs/crdt.md)
    c, _ = _replica(envs)
    bigger, _ = c.propose([])
    liar = Checkpoint(bigger.doc, bigger.heads, hashlib.sha256(canon).digest())
    assert c.adopt(liar, canon)[0] == "its state is behind envelopes we hold"


def test_two_checkpoints_made_apart_are_both_kept_and_their_union_is_checked():
    ws, envs = _history(20)
    base, _ = _replica(envs)
    # two sides of a partition each write and each make a checkpoint
    left = [ws[0].set("left", 1)]
    right = [ws[1].set("right", 2)]
    l_state, _ = _replica(envs + left)
    r_state, _ = _replica(envs + right)
    cp_l, canon_l = l_state.propose([])
    cp_r, canon_r = r_state.propose([])
    assert l_state.adopt(cp_l, canon_l)[0] == ""
    # the left side takes the right side's checkpoint too (it lacks the right's change)
    assert l_state.checkpoints_for(r_state.summary()) == [cp_l]
    why, _ = l_state.adopt(cp_r, canon_r)
    assert why == "" and l_state.checkpoints == [cp_l, cp_r]
    # a checkpoint over both is checked from both states: one covering everything supersedes them
    both, _ = _replica(envs + left + right)
    cp_all, canon_all = l_state.propose([canon_l, canon_r])
    assert both.check(cp_all, []) == ("", canon_all)
    assert l_state.adopt(cp_all, canon_all)[0] == "" and l_state.checkpoints == [cp_all]


def test_a_rebuild_after_a_checkpoint_starts_from_it():
    ws, envs = _history(20)
    a, _ = _replica(envs)
    cp, canon = a.propose([])
    a.adopt(cp, canon)
    later = ws[0].set("z", 1)
    a.receive([later])
    new, out = a.rebuilt()
    assert new.summary() == a.summary() and [e.id for e in out.applied] == [later.id]
    assert new.checkpoints == [cp] and new.base == a.base
