"""The replica's rules (lattica/crdt/_replica.py), sans-IO: real pycrdt documents write real
updates, envelopes are really signed, and every refusal is one an honest author never causes."""

from __future__ import annotations

import os
import random

import pycrdt

from lattica._identity import KeyPair
from lattica.crdt._envelope import ACL, GENESIS, Acl, Envelope, client_id, doc_id, sign, sign_acl
from lattica.crdt._replica import ReplicaState
from lattica.crdt._yupdate import read_update

DOC = doc_id("test/doc", None)


class Writer:
    """An author's session: a pycrdt document under the chain's client id, and its chain."""

    def __init__(self, keys: KeyPair | None = None, doc: bytes = DOC, nonce: bytes | None = None) -> None:
        self.keys = keys or KeyPair.generate()
        self.author = self.keys.peer_id.to_bytes()
        self.doc = doc
        self.nonce = nonce or os.urandom(8)
        self.client = client_id(doc, self.author, self.nonce)
        self.ydoc = pycrdt.Doc(client_id=self.client)
        self.seq, self.prev = 0, GENESIS

    def change(self, fn) -> Envelope:
        events: list[bytes] = []
        sub = self.ydoc.observe(lambda e: events.append(e.update))  # this transaction's changes only
        with self.ydoc.transaction():
            fn(self.ydoc)
        self.ydoc.unobserve(sub)
        update = events[0]
        return self.seal(update)

    def seal(self, update: bytes, deps: dict[int, int] | None = None) -> Envelope:
        """Sign ``update`` as the chain's next envelope; ``deps``: what it names of other
        clients (by default, what it really names)."""
        if deps is None:
            deps = {c: k for c, k in read_update(update).needs.items() if c != self.client}
        self.seq += 1
        env = sign(self.keys, self.doc, self.nonce, self.seq, self.prev, deps, update)
        self.prev = env.id
        return env

    def set(self, key: str, value) -> Envelope:
        return self.change(lambda d: d.get("m", type=pycrdt.Map).__setitem__(key, value))

    def learn(self, envs) -> None:
        for e in envs:
            self.ydoc.apply_update(e.body)


def apply(ydoc: pycrdt.Doc, out) -> None:
    for e in out.applied:
        if e.kind != ACL:
            ydoc.apply_update(e.body)


def test_envelope_round_trip_and_id():
    w = Writer()
    env = w.set("a", 1)
    again = Envelope.from_bytes(env.to_bytes())
    assert again == env and again.id == env.id and again.verify()
    assert Envelope.from_bytes(w.set("a", 2).to_bytes()).id != env.id


def test_an_honest_history_applies_in_any_arrival_order():
    a, b = Writer(), Writer()
    envs = [a.set("x", 1)]
    b.learn(envs)
    envs.append(b.set("y", 2))
    a.learn(envs[1:])
    envs.append(a.change(lambda d: d.get("m", type=pycrdt.Map).pop("y")))  # a deletes b's item
    envs.append(b.set("z", 3))
    for order in range(20):
        shuffled = envs[:]
        random.Random(order).shuffle(shuffled)
        r = ReplicaState(DOC, None)
        ydoc = pycrdt.Doc()
        for e in shuffled:
            out = r.receive([e])
            assert not out.refused, out.refused
            apply(ydoc, out)
        assert r.held() == 0 and len(list(r.log.all())) == 4
        assert ydoc.get("m", type=pycrdt.Map).to_py() == {"x": 1.0, "z": 3.0}


def test_duplicates_are_dropped_without_verifying():
    w = Writer()
    e = w.set("a", 1)
    checked = []
    r = ReplicaState(DOC, None, verify=lambda env: checked.append(env) or env.verify())
    assert r.receive([e]).applied == [e]
    out = r.receive([e, e])
    assert out.duplicates == 2 and not out.applied and len(checked) == 1


def test_forged_signature_is_refused():
    w = Writer()
    e = w.set("a", 1)
    forged = Envelope(e.kind, e.doc, e.author, e.nonce, e.seq, e.prev, e.ts, e.deps, e.body + b"", e.certs, bytes(64))
    forged = Envelope.from_bytes(forged.to_bytes())
    r = ReplicaState(DOC, None)
    out = r.receive([forged])
    assert out.refused[0][1] == "bad signature" and not out.applied
    assert r.receive([e]).applied == [e]  # the real one still goes in


def test_an_update_under_another_writers_client_id_is_refused():
    victim, thief = Writer(), Writer()
    r = ReplicaState(DOC, None)
    apply(pycrdt.Doc(), r.receive([victim.set("a", "victim")]))
    # the thief writes with a document whose client id is the victim's, next clock and all
    fake = pycrdt.Doc(client_id=victim.client)
    fake.apply_update(victim.ydoc.get_update())
    before = fake.get_state()
    fake.get("m", type=pycrdt.Map)["a"] = "thief"
    env = thief.seal(fake.get_update(before))
    out = r.receive([env])
    assert out.refused[0][1] == "items under another client id"
    assert r.receive([victim.set("b", 1)]).applied  # the victim's next real update is unharmed


def test_a_gap_in_the_clock_is_refused():
    w = Writer()
    r = ReplicaState(DOC, None)
    w.set("a", 1)  # never sent: the next update's items start past the replica's clock...
    w.seq, w.prev = 0, GENESIS  # ...though its chain starts afresh
    out = r.receive([w.set("b", 2)])
    assert out.refused[0][1] == "items do not continue the chain's clock"


def test_deps_must_be_what_the_update_names_and_deletes_wait_for_their_items():
    a, b = Writer(), Writer()
    first = a.set("k", 1)
    b.learn([first])
    events = []
    b.ydoc.observe(lambda e: events.append(e.update))
    b.ydoc.get("m", type=pycrdt.Map).pop("k")  # b deletes a's item
    r = ReplicaState(DOC, None)
    lying = Writer(b.keys, nonce=b.nonce)
    assert r.receive([lying.seal(events[0], {})]).refused[0][1] == "deps are not what the update names"
    junk = Writer(b.keys, nonce=b"other")
    assert (
        r.receive([junk.seal(events[0], {a.client: 1, 12345: 0})]).refused[0][1] == "deps are not what the update names"
    )  # (padded)
    honest = b.seal(events[0])
    assert dict(honest.deps) == {a.client: 1}
    assert r.receive([honest]).held == 1  # the item it deletes is not here yet: it waits
    out = r.receive([first])
    assert [e.id for e in out.applied] == [first.id, honest.id]


def test_deps_wait_and_gaps_wait():
    a, b = Writer(), Writer()
    e1 = a.set("x", 1)
    b.learn([e1])
    e2 = b.set("x", 2)  # overwrites a's x: names it (deletes it), so it depends on e1
    e3 = a.set("z", 3)
    r = ReplicaState(DOC, None)
    assert r.receive([e2]).held == 1 and r.receive([e3]).held == 1 and r.held() == 2
    out = r.receive([e1])
    assert [e.id for e in out.applied] == [e1.id, e3.id, e2.id] or [e.id for e in out.applied] == [e1.id, e2.id, e3.id]
    assert r.held() == 0


def test_forks_end_the_chain_before_them_on_every_replica():
    w = Writer()
    e1 = w.set("a", 1)
    twin = Writer(w.keys, nonce=w.nonce)  # the same author and chain, from the same state...
    twin.learn([e1])
    twin.seq, twin.prev = w.seq, w.prev
    e2 = w.set("b", 2)
    other = twin.set("b", 3)  # ...signs another envelope for seq 2
    # a replica that applied e2 learns of the fork: the chain ends at 1, it must rebuild
    r = ReplicaState(DOC, None)
    assert len(r.receive([e1, e2]).applied) == 2
    out = r.receive([other])
    assert out.forks and out.forks[0][1].id == e2.id and out.refused[0][1] == "forked chain" and out.rebuild
    new, replay = r.rebuilt()
    assert [e.id for e in replay.applied] == [e1.id] and new.summary() == {(w.author, w.nonce): 1}
    # a replica that applied the other branch first ends up the same
    r2 = ReplicaState(DOC, None)
    r2.receive([e1, other])
    out = r2.receive([e2])
    assert out.rebuild
    new2, replay2 = r2.rebuilt()
    assert [e.id for e in replay2.applied] == [e1.id] and new2.summary() == new.summary()
    # and one that sees the fork before applying either takes neither
    r3 = ReplicaState(DOC, None)
    r3.receive([e1, e2])
    r3.receive([other])
    r3, _ = r3.rebuilt()
    assert r3.summary() == new.summary()
    # the fork's continuation is refused too, everywhere
    assert new.receive([w.set("c", 4)]).refused[0][1] == "forked chain"


def test_writers_list_decides_and_removed_writers_keep_their_cut():
    owner, writer, outsider = Writer(), Writer(), Writer()
    doc = doc_id("owned", owner.keys.peer_id)
    for w in (owner, writer, outsider):
        w.__init__(w.keys, doc)
    r = ReplicaState(doc, owner.author)
    assert r.receive([writer.set("a", 1)]).refused[0][1] == "author not on the writers list"
    writer.seq, writer.prev = 0, GENESIS
    writer.ydoc = pycrdt.Doc(client_id=writer.client)
    acl1 = sign_acl(owner.keys, doc, 1, GENESIS, Acl(frozenset({writer.author})))
    assert r.receive([acl1]).applied == [acl1]
    w1, w2 = writer.set("a", 1), writer.set("b", 2)
    assert len(r.receive([w1, w2]).applied) == 2
    # the owner removes the writer after its first envelope: the second was already applied
    acl2 = sign_acl(owner.keys, doc, 2, acl1.id, Acl(frozenset(), {(writer.author, writer.nonce): 1}))
    out = r.receive([acl2])
    assert out.rebuild  # w2 was applied and no longer counts
    r, replay = r.rebuilt()
    assert [e.id for e in replay.applied] == [acl1.id, acl2.id, w1.id]
    # a replica that learns of the removal first takes the envelope within the cut only
    r2 = ReplicaState(doc, owner.author)
    assert len(r2.receive([acl1, acl2, w1]).applied) == 3
    assert r2.receive([w2]).refused[0][1] == "author not on the writers list"
    # an ACL by anyone but the owner is refused
    fake = sign_acl(outsider.keys, doc, 3, acl2.id, Acl(frozenset({outsider.author})))
    assert r2.receive([fake]).refused[0][1] == "an ACL not signed by the owner"


def test_another_documents_envelope_is_refused():
    w = Writer(doc=doc_id("other", None))
    assert ReplicaState(DOC, None).receive([w.set("a", 1)]).refused[0][1] == "another document"


def test_too_many_waiting_envelopes_are_refused_not_kept():
    w = Writer()
    envs = [w.set(str(i), i) for i in range(12)]
    r = ReplicaState(DOC, None, max_held=5)
    out = r.receive(envs[1:])
    assert r.held() == 5 and sum(1 for _, why in out.refused if why == "too many envelopes waiting") == 6
    assert len(r.receive([envs[0]]).applied) == 6  # what was held goes in behind the gap's fill
    # one author cannot take every waiting place
    other = Writer()
    r = ReplicaState(DOC, None, max_held=10, max_held_per_author=3)
    r.receive(envs[2:])
    assert r.held() == 3
    later = [other.set(str(i), i) for i in range(4)]
    r.receive(later[1:])
    assert r.held() == 6


def test_missing_for_sends_what_the_other_lacks_in_an_applicable_order():
    a, b = Writer(), Writer()
    e = [a.set("x", 1)]
    b.learn(e)
    e.append(b.set("y", 2))
    e.append(a.set("z", 3))
    r = ReplicaState(DOC, None)
    r.receive(e)
    other = ReplicaState(DOC, None)
    other.receive([e[0]])
    todo = r.missing_for(other.summary())
    assert [x.id for x in todo] == [e[1].id, e[2].id]
    out = other.receive(todo)
    assert len(out.applied) == 2 and other.summary() == r.summary()


def test_convergence_of_random_concurrent_histories():
    """Writers see random parts of each other's work, through replicas of their own (as a node
    does: its document takes only what its replica applied), and write concurrently; replicas fed
    everything in any order and any batching end with the same document, refusing nothing."""
    rnd = random.Random(7)
    writers = [Writer() for _ in range(4)]
    views = {id(w): ReplicaState(DOC, None, max_held=10_000) for w in writers}
    sent: list[Envelope] = []
    for step in range(300):
        w = rnd.choice(writers)
        view = views[id(w)]
        seen = view.receive(rnd.sample(sent, min(len(sent), 6)))
        apply(w.ydoc, seen)
        m = w.ydoc.get("m", type=pycrdt.Map)
        if rnd.random() < 0.25 and len(m):
            key = rnd.choice(list(m.keys()))
            env = w.change(lambda d: d.get("m", type=pycrdt.Map).pop(key))
        else:
            env = w.set(str(rnd.randrange(20)), step)
        view.receive([env], verified=True)
        sent.append(env)
    results = []
    for trial in range(3):
        order = sent[:]
        rnd.shuffle(order)
        r = ReplicaState(DOC, None, max_held=10_000)
        ydoc = pycrdt.Doc()
        for i in range(0, len(order), 7):
            out = r.receive(order[i : i + 7])
            refused = [why for _, why in out.refused]
            assert not refused, refused
            apply(ydoc, out)
        assert r.held() == 0 and len(list(r.log.all())) == len(sent)
        results.append(ydoc.get("m", type=pycrdt.Map).to_py())
    assert results[0] == results[1] == results[2] and results[0]


def test_one_author_can_start_only_so_many_chains():
    from lattica.crdt import _replica as rules

    keys = KeyPair.generate()
    r = ReplicaState(DOC, None)
    n = rules.MAX_CHAINS_PER_AUTHOR
    outs = [r.receive([Writer(keys, nonce=i.to_bytes(4, "big")).set("k", i)]) for i in range(n + 3)]
    assert sum(len(o.applied) for o in outs) == n
    assert [o.refused[0][1] for o in outs[n:]] == ["too many chains of one author"] * 3
    assert r.receive([Writer().set("k", 0)]).applied  # another author still may


def test_waiting_room_is_shared_fairly_and_forgets_what_waits_too_long():
    now = [0.0]
    r = ReplicaState(DOC, None, max_held=1000, max_held_bytes=80_000, clock=lambda: now[0])
    hog = Writer()
    hog.set("gap", 0)  # never sent: everything after it waits
    refused = [r.receive([hog.set("k", "x" * 2000)]).refused for _ in range(20)]
    assert r.held() < 20 and refused[-1][0][1] == "too many envelopes waiting"  # at most 1/8 of the bytes
    a, b = Writer(), Writer()
    e1 = a.set("x", 1)
    b.learn([e1])
    early = b.set("x", 2)  # names a's item: waits for it
    assert r.receive([early]).held == 1  # an honest author still finds room
    now[0] += 121.0
    r.receive([Writer().set("tick", 1)])
    r.receive([Writer().set("gap", 1)])  # (holding something runs the expiry)
    late = Writer()
    late.set("gap", 0)
    r.receive([late.set("k", 1)])
    assert r.held() == 1  # what waited over HOLD_FOR is gone; anti-entropy brings it again
