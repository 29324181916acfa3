"""The CRDT store between real nodes on loopback (docs/crdt.md): replicas converge through pub-sub
and anti-entropy, commits wait for other replicas, documents persist, and every forged or
unauthorized envelope a peer sends is refused, counted and neither applied nor passed on."""

from __future__ import annotations

import asyncio
import os
import time

import pycrdt
import pytest

import lattica
from helpers import wait_for
from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import ActorRef
from lattica.actors.crdt.wire import actor_name, topic_of
from lattica.config import CrdtConfig, PubSubConfig
from lattica.crdt._envelope import GENESIS, Envelope, client_id, sign
from lattica.crdt._yupdate import read_update
from lattica.errors import NotAWriter, ProtocolError, Timeout
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"


def _node(tmp_path, i, key, **kw):
    return lattica.Node(
        [TCP], mesh=key, crdt=CrdtConfig(path=str(tmp_path / f"n{i}"), **kw), pubsub=PubSubConfig(discover=False)
    ).start()


@pytest.fixture
def trio(tmp_path):
    """Three members, each connected to the others."""
    key = MeshKey.generate()
    nodes = [_node(tmp_path, i, key) for i in range(3)]
    try:
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                b.connect(a.addrs[0])
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _peers_ready(docs, n):
    wait_for(lambda: all(len(d.peers()) >= n for d in docs), timeout=10)


def _push(node, target, doc, envs):
    """Call ``target``'s replica of ``doc`` as ``node`` would: push raw envelope bytes."""
    ref = ActorRef(target.peer_id, actor_name(bytes.fromhex(doc.id)), {"sync": ASYNC, "push": ASYNC})
    return node.host.runtime.call(ref, "push", (envs,), {}, timeout=5.0)


def _call(node, fn):
    """Run ``fn()`` on ``node``'s loop and wait for what it returns (awaited if awaitable)."""

    async def go():
        out = fn()
        return await out if hasattr(out, "__await__") else out

    return asyncio.run_coroutine_threadsafe(go(), node.host.loop).result(10)


def test_replicas_converge_and_commit_waits_for_others(trio):
    docs = [lattica.crdt.open("swarm/config", node=n) for n in trio]
    _peers_ready(docs, 2)
    seen = []
    docs[2].observe(lambda ch: seen.append(ch))
    sub = docs[1].changes()
    for i, d in enumerate(docs):
        with d.transaction():
            d.map("layers")[f"part{i}"] = i
            d.text("log").insert(0, f"<{i}>")
    assert docs[0].commit(replicas=2).result(10) == 2
    want = docs[0].to_py()
    wait_for(
        lambda: all(d.to_py() == docs[0].to_py() for d in docs) and len(docs[0].to_py()["layers"]) == 3, timeout=10
    )
    assert set(docs[0].to_py()["layers"]) == {"part0", "part1", "part2"}, want
    assert len(seen) == 3 and {c.local for c in seen} == {True, False}
    change = sub.get(timeout=5)
    assert change.author in {n.peer_id for n in trio}
    assert lattica.crdt.list(node=trio[0]) == ["swarm/config"]
    for d in docs:
        st = d.stats()
        assert st["refused"] == 0 and st["held"] == 0 and st["chains"] == 3


def test_a_new_replica_catches_up_from_any_replica_not_only_the_author(tmp_path):
    key = MeshKey.generate()
    a, b, c = (_node(tmp_path, i, key) for i in range(3))
    try:
        b.connect(a.addrs[0])
        da, db = lattica.crdt.open("d", node=a), lattica.crdt.open("d", node=b)
        _peers_ready([da, db], 1)
        for i in range(50):
            da.map("m")[str(i)] = i
        da.commit(replicas=1).result(10)
        a.stop()  # the author is gone
        c.connect(b.addrs[0])
        dc = lattica.crdt.open("d", node=c)
        wait_for(lambda: len(dc.to_py().get("m", {})) == 50, timeout=10)
        assert dc.to_py() == db.to_py()
    finally:
        for n in (a, b, c):
            n.stop()


def test_owner_documents_take_writers_only(trio):
    owner, writer, other = trio
    d_owner = lattica.crdt.open("owned", owner=owner.peer_id, writers=[writer.peer_id], node=owner)
    d_writer = lattica.crdt.open("owned", owner=owner.peer_id, node=writer)
    d_other = lattica.crdt.open("owned", owner=str(owner.peer_id), node=other)
    _peers_ready([d_owner, d_writer, d_other], 2)
    wait_for(lambda: d_writer.writers == [writer.peer_id] and d_other.writers == [writer.peer_id], timeout=10)
    with d_writer.transaction():
        d_writer.map("cfg")["lr"] = 0.1
    d_writer.commit(replicas=2).result(10)
    assert d_owner.to_py() == d_other.to_py() == {"cfg": {"lr": 0.1}}
    with pytest.raises(NotAWriter):
        d_other.transaction()
    # a member not on the list signs an update and pushes it anyway: refused, not applied
    rogue = _envelope(other, d_other, lambda m: m.__setitem__("lr", 666.0))
    _call(other, lambda: _push(other, owner, d_owner, [rogue.to_bytes()]))
    assert d_owner.to_py() == {"cfg": {"lr": 0.1}}
    assert d_owner.stats()["refused_by_reason"] == {"author not on the writers list": 1}
    # the owner removes the writer: what it wrote stays, what it writes next is refused
    d_owner.set_writers([])
    wait_for(lambda: d_writer.writers == [] and d_other.writers == [], timeout=10)
    with pytest.raises(NotAWriter):
        d_writer.transaction()
    with pytest.raises(lattica.errors.LatticaError):
        lattica.crdt.open(
            "owned", owner=owner.peer_id, writers=[other.peer_id], node=other
        )  # only the owner sets writers


def _envelope(node, doc, edit, client=None, nonce=b"rogue-nonce", seq=1, prev=GENESIS, key=None):
    """An envelope signed by ``node`` (or ``key``) for ``doc``: ``edit`` on the root map "cfg"
    of a scratch pycrdt document that holds ``doc``'s state and writes under ``client``."""
    keypair = key or node.keypair
    author = keypair.peer_id.to_bytes()
    did = bytes.fromhex(doc.id)
    scratch = pycrdt.Doc(client_id=client or client_id(did, author, nonce))
    rep = node.host.services.crdt.docs[did]
    scratch.apply_update(rep.ydoc.get_update())
    events = []
    scratch.observe(lambda e: events.append(e.update))
    with scratch.transaction():
        edit(scratch.get("cfg", type=pycrdt.Map))
    mine = client or client_id(did, author, nonce)
    deps = {c: k for c, k in read_update(events[0]).needs.items() if c != mine}
    return sign(keypair, did, nonce, seq, prev, deps, events[0], tuple(node.trust.presented))


def test_forged_and_foreign_envelopes_are_refused_and_not_passed_on(trio):
    a, b, c = trio
    docs = [lattica.crdt.open("mesh-doc", node=n) for n in trio]
    _peers_ready(docs, 2)
    with docs[1].transaction():
        docs[1].map("cfg")["owner-of-this-key"] = "b"
    docs[1].commit(replicas=2).result(10)
    before = docs[0].to_py()
    rep_b = b.host.services.crdt.docs[bytes.fromhex(docs[1].id)]
    # 1. c claims b's client id (and b's next clock)
    stolen = _envelope(c, docs[2], lambda m: m.__setitem__("owner-of-this-key", "c"), client=rep_b.client)
    # 2. a bad signature
    good = _envelope(c, docs[2], lambda m: m.__setitem__("x", 1.0), nonce=b"n2")
    forged = Envelope.from_bytes(Envelope(*[*_fields(good)[:-2], bytes(64), b""]).to_bytes())
    # 3. garbage, 4. another document's envelope, 5. an oversized one
    other_doc = lattica.crdt.open("another", node=c)
    foreign = _envelope(c, other_doc, lambda m: m.__setitem__("y", 1.0), nonce=b"n3")
    big = _envelope(c, docs[2], lambda m: m.__setitem__("big", "z" * (2 << 20)), nonce=b"n4")
    raws = [stolen.to_bytes(), forged.to_bytes(), b"\x93garbage", foreign.to_bytes(), big.to_bytes()]
    # through pub-sub (validated before anything is passed on) and through anti-entropy
    svc_c = c.host.services.pubsub
    _call(c, lambda: _publish_raw(svc_c, topic_of(bytes.fromhex(docs[2].id)), raws[:2]))
    _call(c, lambda: _push(c, a, docs[0], raws))
    time.sleep(1.0)
    assert docs[0].to_py() == before and docs[1].to_py() == before
    reasons = docs[0].stats()["refused_by_reason"]
    assert reasons.get("items under another client id", 0) >= 1 and reasons.get("bad signature", 0) >= 1
    assert (
        reasons.get("another document") == 1
        and reasons.get("too large") == 1
        and reasons.get("malformed envelope") == 1
    )
    assert (
        docs[1].stats()["refused_by_reason"].get("items under another client id", 0) >= 1
    )  # b judged c's pub-sub copy itself
    # b's own next change still goes everywhere (its chain and client clock are intact)
    docs[1].map("cfg")["after"] = 1
    docs[1].commit(replicas=2).result(10)
    wait_for(lambda: docs[0].to_py()["cfg"].get("after") == 1, timeout=5)


async def _publish_raw(svc, topic, raws):
    for raw in raws:
        svc.publish(topic, raw)


def _fields(env):
    return [
        env.kind,
        env.doc,
        env.author,
        env.nonce,
        env.seq,
        env.prev,
        env.ts,
        env.deps,
        env.body,
        env.certs,
        env.sig,
        env.id,
    ]


def test_bad_calls_to_a_replica_get_a_clear_error(trio):
    a, b, _ = trio
    d = lattica.crdt.open("bad-input", node=a)
    lattica.crdt.open("bad-input", node=b)
    ref = ActorRef(a.peer_id, actor_name(bytes.fromhex(d.id)), {"sync": ASYNC, "push": ASYNC})
    for method, arg in [("push", "not a list"), ("push", [b"x"] * 5000), ("sync", [[1, 2, 3]]), ("sync", "x")]:
        with pytest.raises(ProtocolError):
            _call(b, lambda: b.host.runtime.call(ref, method, (arg,), {}, timeout=5))
    with pytest.raises(lattica.errors.ActorNotFound):
        missing = ActorRef(a.peer_id, "crdt/" + "00" * 32, {"sync": ASYNC})
        _call(b, lambda: b.host.runtime.call(missing, "sync", ([],), {}, timeout=5))
    d.map("m")["still"] = "fine"
    assert d.to_py() == {"m": {"still": "fine"}}


def test_commit_times_out_without_enough_replicas(tmp_path):
    key = MeshKey.generate()
    a = _node(tmp_path, 0, key)
    try:
        d = lattica.crdt.open("alone", node=a)
        d.map("m")["k"] = 1
        assert d.commit().result(5) == 0  # on disk here: no other replica needed
        with pytest.raises(Timeout):
            d.commit(replicas=1, timeout=0.5).result(5)
    finally:
        a.stop()


def test_reopening_after_a_restart_gives_the_same_state_and_continues_the_chain(tmp_path):
    key = MeshKey.generate()
    keyfile = str(tmp_path / "node.key")
    cfg = CrdtConfig(path=str(tmp_path / "store"), snapshot_every=7)
    n = lattica.Node([TCP], mesh=key, key_path=keyfile, crdt=cfg).start()
    try:
        d = lattica.crdt.open("persist", node=n)
        for i in range(20):
            d.map("m")[str(i)] = i
        d.text("t").insert(0, "hello")
        d.commit().result(5)
        state, chains = d.to_py(), d.stats()["chains"]
    finally:
        n.stop()
    n = lattica.Node([TCP], mesh=key, key_path=keyfile, crdt=cfg).start()
    try:
        d = lattica.crdt.open("persist", node=n)
        assert d.to_py() == state and d.stats()["chains"] == chains
        d.map("m")["after"] = 1  # the same chain goes on (no fork with what peers hold)
        d.commit().result(5)
        assert d.stats()["chains"] == chains
    finally:
        n.stop()


def test_a_fresh_script_writes_commits_to_a_replica_and_exits(tmp_path):
    """Cold start: a script starts a node with one bootstrap peer, opens the document, writes,
    waits for one other replica and ends; the long-lived replica holds the change."""
    import subprocess
    import sys

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, crdt=CrdtConfig(path=str(tmp_path / "long"))) as long_lived:
        doc = lattica.crdt.open("cold", node=long_lived)
        script = f"""
import lattica
lattica.init([], bootstrap=[{str(long_lived.addrs[0])!r}])
doc = lattica.crdt.open("cold")
with doc.transaction():
    doc.map("runs")["script"] = "done"
print(doc.commit(replicas=1, timeout=20).result(25))
"""
        env = {**os.environ, "LATTICA_MESH": key.to_text(), "LATTICA_CRDT": str(tmp_path / "script")}
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "1", out.stdout
        assert doc.to_py() == {"runs": {"script": "done"}}
        print(
            f"\ncrdt cold start: a fresh process wrote, committed to 1 replica and exited in {time.monotonic() - t0:.2f} s"
        )


def test_a_forking_member_s_chain_ends_before_the_fork_on_every_replica(trio):
    """c signs two different envelopes for one place and gives one to a, the other to b: each
    applies its own, sees the other's (anti-entropy or the proof the first to notice sends) and
    rebuilds without both: the replicas agree again."""
    a, b, c = trio
    docs = [lattica.crdt.open("forked", node=n) for n in trio]
    _peers_ready(docs, 2)
    docs[0].map("cfg")["base"] = 1
    docs[0].commit(replicas=2).result(10)
    one = _envelope(c, docs[2], lambda m: m.__setitem__("k", "seen by a"), nonce=b"fork")
    two = _envelope(c, docs[2], lambda m: m.__setitem__("k", "seen by b"), nonce=b"fork")
    assert one.seq == two.seq == 1 and one.id != two.id
    _call(c, lambda: _push(c, a, docs[0], [one.to_bytes()]))
    _call(c, lambda: _push(c, b, docs[1], [two.to_bytes()]))
    # (even when each replica got its envelope before any sync: summaries carry the heads' ids,
    # so two replicas at one seq see they hold different envelopes for it)
    assert wait_for(lambda: docs[0].to_py() == docs[1].to_py() == {"cfg": {"base": 1}}, timeout=15), [
        d.to_py() for d in docs
    ]
    assert docs[0].stats()["forks"] + docs[1].stats()["forks"] >= 1
    assert docs[0].stats()["rebuilds"] == 1 and docs[1].stats()["rebuilds"] == 1
    docs[0].map("cfg")["after"] = 2  # the document goes on
    docs[0].commit(replicas=2).result(10)
    wait_for(lambda: docs[1].to_py() == docs[0].to_py() == {"cfg": {"base": 1, "after": 2}}, timeout=10)


def test_writes_from_several_threads_and_a_reopen_after_close(tmp_path):
    import threading

    key = MeshKey.generate()
    a, b = _node(tmp_path, 0, key), _node(tmp_path, 1, key)
    try:
        b.connect(a.addrs[0])
        da, db = lattica.crdt.open("threads", node=a), lattica.crdt.open("threads", node=b)
        _peers_ready([da, db], 1)

        def writer(t):
            for i in range(100):
                with da.transaction():
                    da.map(f"t{t}")[str(i)] = i

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        da.commit(replicas=1).result(10)
        wait_for(lambda: db.to_py() == da.to_py() and len(db.to_py()) == 4, timeout=10)
        assert all(len(v) == 100 for v in db.to_py().values())
        db.close()
        assert lattica.crdt.list(node=b) == []
        db = lattica.crdt.open("threads", node=b)  # back from its store at once
        assert db.to_py() == da.to_py()
    finally:
        a.stop()
        b.stop()
