"""Forged and tampered CRDT envelopes against the replica's rules (lattica/crdt/_replica.py), counted:
every envelope that differs from an honest one in any byte, and every unauthorized one, is refused
(or, where the change left the signed content as it was, recognised as the same envelope), and the
document holds exactly the honest history."""

from __future__ import annotations

import os
import random
import sys

import pycrdt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "unit"))
from test_crdt_replica import DOC, Writer, apply  # noqa: E402

from lattica.crdt._envelope import GENESIS, Acl, Envelope, doc_id, sign_acl  # noqa: E402
from lattica.crdt._replica import ReplicaState  # noqa: E402
from lattica.errors import MalformedUpdate  # noqa: E402


def test_every_tampered_envelope_is_refused():
    rnd = random.Random(11)
    a, b = Writer(), Writer()
    honest = [a.set("x", 1)]
    b.learn(honest)
    honest.append(b.set("x", 2))
    honest.append(a.change(lambda d: d.get("t", type=pycrdt.Text).insert(0, "hello")))
    target = b.set("y", "target")
    reference = ReplicaState(DOC, None)
    ref_doc = pycrdt.Doc()
    apply(ref_doc, reference.receive(honest + [target]))
    want = ref_doc.get("m", type=pycrdt.Map).to_py()
    raw = bytearray(target.to_bytes())
    tried = refused = same = undecodable = 0
    for _ in range(1500):
        forged = bytearray(raw)
        for _ in range(rnd.randrange(1, 3)):
            forged[rnd.randrange(len(forged))] = rnd.randrange(256)
        try:
            env = Envelope.from_bytes(bytes(forged))
        except MalformedUpdate:
            undecodable += 1
            continue
        tried += 1
        r = ReplicaState(DOC, None)
        ydoc = pycrdt.Doc()
        apply(ydoc, r.receive(honest))
        out = r.receive([env])
        if env.id == target.id:  # (the change did not touch what is signed: msgpack allows it)
            same += 1
            continue
        assert not out.applied and not out.held and len(out.refused) == 1, out  # (its signature no longer holds)
        refused += 1
        apply(ydoc, out)
        assert ydoc.get("m", type=pycrdt.Map).to_py() == {"x": 2.0}
    print(
        f"\ntampered envelopes: {tried} decoded, {refused} refused, {same} the same envelope, {undecodable} not envelopes"
    )
    assert tried > 500 and refused == tried - same  # every one that decoded and changed: refused
    assert want == {"x": 2.0, "y": "target"}


def test_unauthorized_writers_and_acls_are_refused_in_any_order():
    owner, writer, outsider = Writer(), Writer(), Writer()
    doc = doc_id("owned", owner.keys.peer_id)
    for w in (owner, writer, outsider):
        w.__init__(w.keys, doc)
    acl1 = sign_acl(owner.keys, doc, 1, GENESIS, Acl(frozenset({writer.author})))
    envs = [
        acl1,
        writer.set("ok", 1),
        outsider.set("bad", 1),
        outsider.set("bad2", 2),
        sign_acl(outsider.keys, doc, 2, acl1.id, Acl(frozenset({outsider.author}))),
        sign_acl(outsider.keys, doc, 1, GENESIS, Acl(frozenset({outsider.author}))),
    ]
    for seed in range(10):
        order = envs[:]
        random.Random(seed).shuffle(order)
        r = ReplicaState(doc, owner.author)
        out = r.receive(order)
        applied = {e.id for e in out.applied}
        assert applied <= {acl1.id, envs[1].id}
        refused = [why for _, why in out.refused]
        assert refused.count("an ACL not signed by the owner") == 2
        assert sum(1 for why in refused if why == "author not on the writers list") >= 2
