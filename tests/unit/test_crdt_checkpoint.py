"""Checkpoints (lattica/crdt/_checkpoint.py and the replica's rules for them), sans-IO: real
pycrdt updates in really signed envelopes; a checkpoint is computed, checked by another replica
from its own log, taken (its envelopes dropped) and given to a newcomer."""

from __future__ import annotations

import hashlib
import random

import pycrdt
import pytest
from test_crdt_replica import DOC, Writer, apply

from lattica._identity import KeyPair
from lattica.crdt._checkpoint import Checkpoint, Signature, canonical_state, check_state
from lattica.crdt._envelope import doc_id
from lattica.crdt._replica import ReplicaState
from lattica.errors import MalformedUpdate


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
        assert canonical_state([canonical_state(shuffled[: cut + 5]), canonical_state(shuffled[cut:])]) == one


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
    later.append(
        ws[0].change(
            lambda d: d.get("m", type=pycrdt.Map).pop("1", None) or d.get("m", type=pycrdt.Map).__setitem__("k", 9)
        )
    )
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
    late = ReplicaState(DOC, None)
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


def _nested_history(rng: random.Random) -> list[bytes]:
    """Three documents making random nested edits (maps and arrays inside maps and arrays,
    texts with formatting and non-ASCII, deletes of nested content), learning each other's at
    random: every transaction's update."""
    docs = [pycrdt.Doc(client_id=i + 1) for i in range(3)]
    ups: list[bytes] = []
    applying = [False]
    for d in docs:
        d.observe(lambda e: None if applying[0] else ups.append(e.update))
    for step in range(rng.randint(5, 50)):
        d = rng.choice(docs)
        with d.transaction():
            m, t, a = d.get("m", type=pycrdt.Map), d.get("t", type=pycrdt.Text), d.get("a", type=pycrdt.Array)
            op = rng.random()
            if op < 0.2:
                m[str(rng.randrange(5))] = pycrdt.Map({"x": step, "l": pycrdt.Array([1, 2])})
            elif op < 0.3 and len(m):
                del m[rng.choice(list(m.keys()))]
            elif op < 0.45:
                inner = m.get("0")
                if isinstance(inner, pycrdt.Map):
                    inner[str(step)] = pycrdt.Text("hé")
                else:
                    m["0"] = step
            elif op < 0.65:
                t.insert(len(t), rng.choice(["ab", "c", "dé", "😀"]))
            elif op < 0.75 and len(a):
                del a[rng.randrange(len(a))]
            elif op < 0.9:
                a.insert(rng.randint(0, len(a)), pycrdt.Array([step, pycrdt.Map({"k": 1})]))
            elif len(t):
                t.format(0, 1, {"bold": True})
        for o in docs:
            if o is not d and rng.random() < 0.5:
                applying[0] = True
                o.apply_update(d.get_update(o.get_state()))
                applying[0] = False
    return ups


@pytest.mark.parametrize("seed", range(30))
def test_the_canonical_state_holds_for_nested_types_and_formatting(seed):
    """Checkpoints rest on this: honest replicas compute one state from one set of updates, in
    whatever order and grouping they hold them (else they would refuse each other's)."""
    rng = random.Random(seed)
    ups = _nested_history(rng)
    one = canonical_state(ups)
    for _ in range(4):
        shuffled = ups[:]
        rng.shuffle(shuffled)
        k, j = sorted((rng.randint(0, len(ups)), rng.randint(0, len(ups))))
        assert canonical_state(shuffled) == one
        assert canonical_state([canonical_state(shuffled[:j]), canonical_state(shuffled[k:])]) == one
    ydoc = pycrdt.Doc()
    ydoc.apply_update(one)
    whole = pycrdt.Doc()
    for u in ups:
        whole.apply_update(u)
    assert ydoc.get("m", type=pycrdt.Map).to_py() == whole.get("m", type=pycrdt.Map).to_py()
    assert str(ydoc.get("t", type=pycrdt.Text)) == str(whole.get("t", type=pycrdt.Text))


def test_a_replayed_older_checkpoint_adds_nothing():
    ws, envs = _history(20)
    a, _ = _replica(envs[:10])
    old, old_state = a.propose([])
    b, _ = _replica(envs)
    new, new_state = b.propose([])
    fresh = ReplicaState(DOC, None)
    assert fresh.adopt(new, new_state)[0] == ""
    assert fresh.superseded(old) and fresh.adopt(old, old_state)[0] == "" and fresh.checkpoints == [new]


def test_a_second_claim_on_the_same_heads_costs_no_merge(monkeypatch):
    import lattica.crdt._replica as rules

    ws, envs = _history(20)
    b, _ = _replica(envs)
    cp, canon = b.propose([])
    merges = []
    real = rules.canonical_state
    monkeypatch.setattr(rules, "canonical_state", lambda ups: merges.append(len(ups)) or real(ups))
    for k in range(5):
        bogus = Checkpoint(cp.doc, cp.heads, hashlib.sha256(bytes([k])).digest())
        assert b.check(bogus, [])[0] == "its state is not what the envelopes it covers make"
    assert b.check(cp, []) == ("", canon)
    assert len(merges) <= 1


def test_a_fork_across_a_proposal_is_shown_to_the_proposer_which_then_ends_the_chain():
    """A hostile author gives the proposer one envelope and another replica a second for the
    same place: asked to sign, that replica finds the checkpoint names another envelope than its
    own, and shows it; the proposer sees both, ends the chain and will not take the checkpoint."""
    ws, envs = _history(10)
    hostile = ws[0]
    twin = Writer(keys=hostile.keys, nonce=hostile.nonce)  # (the same chain, signing the same place again)
    twin.learn(envs)
    twin.seq, twin.prev = hostile.seq, hostile.prev
    one = hostile.set("x", "one")
    two = twin.set("x", "two")
    assert one.seq == two.seq and one.id != two.id
    proposer, _ = _replica(envs + [one])
    other, _ = _replica(envs + [two])
    cp, _ = proposer.propose([])
    assert other.check(cp, [])[0] == "it disagrees with an envelope we hold"
    shown = other.disagreeing(cp)
    assert [e.id for e in shown] == [two.id]
    out = proposer.receive(shown)
    assert out.forks and out.rebuild and proposer.frozen[one.chain] == one.seq - 1
    assert proposer.check(cp, [])[0] == "it covers a forked chain past its end"
    assert proposer.propose([]) is None  # (until the rebuild)
    rebuilt, _ = proposer.rebuilt()
    again, _ = rebuilt.propose([])
    assert dict(again.covers())[one.chain] == one.seq - 1


def test_a_state_that_leaves_out_an_envelope_held_or_is_not_canonical_is_refused():
    ws, envs = _history(10)
    solo = Writer()
    made = solo.set("gone", 1)
    unmade = solo.change(lambda d: d.get("m", type=pycrdt.Map).pop("gone"))  # (a delete: no new clock)
    holder, _ = _replica(envs + [made, unmade])
    cp, canon = holder.propose([])
    # a checkpoint naming both, whose state leaves the delete out, plus a chain nobody holds (so
    # the holder cannot check it and would go by its signatures): what it holds must be there
    stranger = Writer()
    heads = tuple(sorted(cp.heads + ((stranger.author, stranger.nonce, 1, bytes(32)),)))
    without = canonical_state([e.body for e in envs] + [made.body])
    liar = Checkpoint(cp.doc, heads, hashlib.sha256(without).digest())
    assert holder.check(liar, [])[0] == "we do not hold everything it covers"
    assert holder.adopt(liar, without)[0] == "its state leaves out envelopes we hold"
    assert holder.checkpoints == [] and len(holder.log) == 12
    # the same content, not in the form a merge gives (a document's own encoding of its state)
    ydoc = pycrdt.Doc()
    for e in envs + [made, unmade]:
        ydoc.apply_update(e.body)
    raw = ydoc.get_update()
    assert raw != canon
    odd = Checkpoint(cp.doc, cp.heads, hashlib.sha256(raw).digest())
    assert check_state(odd, raw)[0] == "the state is not in its canonical form"


def test_a_settled_checkpoint_decides_a_fork_inside_what_it_covers():
    """The side that ended a forked chain, handed a checkpoint (taken on the other side) that
    names the other branch, lets its own branch go and takes it: both sides go on alike."""
    ws, envs = _history(10)
    hostile = ws[0]
    twin = Writer(keys=hostile.keys, nonce=hostile.nonce)
    twin.learn(envs)
    twin.seq, twin.prev = hostile.seq, hostile.prev
    one = hostile.set("x", "one")  # (the branch the checkpoint takes)
    two = twin.set("x", "two")
    after = hostile.set("y", "after one")  # (names `one`)
    b, doc_b = _replica(envs + [one])
    cp, canon = b.propose([])
    b.adopt(cp, canon)
    d, doc_d = _replica(envs + [two])
    out = d.receive([after])  # d sees the fork: the chain ends before it, `two` goes in a rebuild
    assert out.forks and out.rebuild
    d, _ = d.rebuilt()
    assert d.check(cp, [])[0] == "it covers a forked chain past its end"
    assert not d.yield_to(cp)  # (ended already)
    why, _ = d.adopt(cp, canon)
    assert why == "" and one.chain not in d.frozen and d.head(one.chain) == (one.seq, one.id)
    out = d.receive([two, after])
    assert out.duplicates == 1 and [e.id for e in out.applied] == [after.id]
    assert b.receive([after]).applied and d.summary() == b.summary()


def test_a_replica_that_applied_the_other_branch_ends_it_when_a_settled_checkpoint_names_the_first():
    ws, envs = _history(10)
    hostile = ws[0]
    twin = Writer(keys=hostile.keys, nonce=hostile.nonce)
    twin.learn(envs)
    twin.seq, twin.prev = hostile.seq, hostile.prev
    one = hostile.set("x", "one")
    two = twin.set("x", "two")
    b, _ = _replica(envs + [one])
    cp, canon = b.propose([])
    d, _ = _replica(envs + [two])
    assert d.check(cp, [])[0] == "it disagrees with an envelope we hold"
    assert d.yield_to(cp) and d.frozen[two.chain] == two.seq - 1
    d, _ = d.rebuilt()
    assert d.adopt(cp, canon)[0] == "" and d.head(one.chain) == (one.seq, one.id)


def test_equal_summaries_over_different_envelopes_show_the_fork():
    """Two replicas each got one of two envelopes an author signed for one place: their seqs
    are equal, so only the heads' ids tell them apart; ``differing`` hands over the envelope."""
    ws, envs = _history(6)
    hostile = ws[0]
    twin = Writer(keys=hostile.keys, nonce=hostile.nonce)
    twin.learn(envs)
    twin.seq, twin.prev = hostile.seq, hostile.prev
    one, two = hostile.set("x", 1), twin.set("x", 2)
    a, _ = _replica(envs + [one])
    b, _ = _replica(envs + [two])
    assert a.summary() == b.summary()
    ids_b = {c: i[:16] for c, (s, i) in b.heads.items()}
    shown = a.differing(b.summary(), ids_b)
    assert [e.id for e in shown] == [one.id]
    out = b.receive(shown)
    assert out.forks and b.frozen[one.chain] == one.seq - 1
    assert a.differing(a.summary(), {c: i[:16] for c, (s, i) in a.heads.items()}) == []
