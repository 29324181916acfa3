"""The pub-sub router (lattica.pubsub._router), sans sockets: meshes, GRAFT/PRUNE and backoff,
gossip, validation hand-off, scores, bounds; and the router simulation (short by default)."""

from __future__ import annotations

import random

import pytest

from lattica.bench.pubsub import simulate
from lattica.pubsub._router import ACCEPT, IGNORE, LIBP2P_MARK, REJECT, Envelope, GossipParams, Router, Rpc, flood_tag

T = "t"


def msg(author: int, seq: int, data: bytes = b"hi", topic: str = T) -> Envelope:
    return Envelope(topic, author.to_bytes(4, "big"), seq, data)


def wire(routers: dict, now: float, rounds: int = 20) -> None:
    """Deliver every batch at once (no latency) and accept every message, until quiet."""
    for _ in range(rounds):
        moved = False
        for name, r in routers.items():
            for m, _ in r.take_to_validate():
                r.validated(m.id, ACCEPT, now)
            for peer, rpc in r.take_outgoing().items():
                if peer in routers:
                    moved = True
                    routers[peer].on_rpc(name, rpc, now)
        if not moved:
            return


def net(n: int, seed: int = 1, params: GossipParams | None = None) -> dict:
    routers = {i: Router(i, params, rng=random.Random(seed + i)) for i in range(n)}
    for i in routers:
        for j in routers:
            if i < j:
                routers[i].add_peer(j, 0.0)
                routers[j].add_peer(i, 0.0)
    return routers


def test_a_topic_mesh_forms_within_its_degrees_and_every_member_gets_each_message():
    routers = net(30)
    for r in routers.values():
        r.join(T, 0.0)
    wire(routers, 0.0)
    for t in range(1, 4):
        for r in routers.values():
            r.heartbeat(float(t))
        wire(routers, float(t))
    p = GossipParams()
    for r in routers.values():
        assert p.d_lo <= len(r.mesh[T]) <= p.d_hi
        for q in r.mesh[T]:
            assert r.me in routers[q].mesh[T], "mesh links are symmetric"
    m = msg(0, 1)
    assert routers[0].publish(m, 4.0) == 29  # flood publishing: every peer of the topic
    wire(routers, 4.0)
    for i, r in routers.items():
        got = r.take_delivered()
        assert got == [m], f"router {i} got {got}"


def test_a_message_is_forwarded_once_and_never_back():
    routers = net(8, params=GossipParams(flood_publish=False))
    for r in routers.values():
        r.join(T, 0.0)
    wire(routers, 0.0)
    m = msg(3, 1)
    routers[3].publish(m, 1.0)
    sent = {}
    for _ in range(10):
        for name, r in routers.items():
            for x, _ in r.take_to_validate():
                r.validated(x.id, ACCEPT, 1.0)
            for peer, rpc in r.take_outgoing().items():
                for x in rpc.messages:
                    assert (name, peer) not in sent, "a router sends one message to one peer once"
                    sent[(name, peer)] = x
                routers[peer].on_rpc(name, rpc, 1.0)
    assert all(p != 3 for (_, p) in sent), "nobody sends a message back to its author"


def test_messages_wait_for_validation_and_rejected_ones_cost_their_senders():
    a, b, c = Router("a"), Router("b"), Router("c")
    routers = {"a": a, "b": b, "c": c}
    for x, y in (("a", "b"), ("b", "c")):
        routers[x].add_peer(y, 0.0)
        routers[y].add_peer(x, 0.0)
    for r in routers.values():
        r.join(T, 0.0)
    wire(routers, 0.0)
    bad, meh = msg(9, 1), msg(9, 2)
    b.on_rpc("a", Rpc(messages=[bad, meh]), 1.0)
    pending = b.take_to_validate()
    assert [m for m, _ in pending] == [bad, meh] and b.take_delivered() == []
    assert not any(r.messages for r in b.take_outgoing().values()), "nothing forwarded before validation"
    b.validated(bad.id, REJECT, 1.0)
    b.validated(meh.id, IGNORE, 1.0)
    assert b.take_delivered() == [] and not any(r.messages for r in b.take_outgoing().values())
    assert b.score("a", 1.0) < 0
    b.on_rpc("a", Rpc(messages=[bad]), 1.1)  # the same invalid message again: no new validation
    assert b.take_to_validate() == []
    for _ in range(3):
        b.on_rpc("c", Rpc(messages=[msg(9, 3 + _)]), 1.2)
        for m, _p in b.take_to_validate():
            b.validated(m.id, REJECT, 1.2)
    assert b.score("c", 1.2) < b.scores.params.graylist_threshold
    b.take_outgoing()
    b.on_rpc("c", Rpc(messages=[msg(7, 1)], graft=[T]), 1.3)  # graylisted: nothing looked at
    assert b.take_to_validate() == [] and b.take_outgoing() == {}


def test_grafting_during_a_backoff_is_refused_and_scored():
    a = Router("a")
    a.add_peer("b", 0.0)
    a.join(T, 0.0)
    a.on_rpc("b", Rpc(subscribe=[(T, True)]), 0.0)
    a.heartbeat(1.0)
    assert "b" in a.mesh[T] and a.take_outgoing()["b"].graft == [T]
    a.on_rpc("b", Rpc(prune=[(T, 30.0)]), 2.0)  # b leaves: a may not graft it for 30 s
    assert "b" not in a.mesh[T]
    for t in range(3, 30):
        a.heartbeat(float(t))
    assert "b" not in a.mesh[T] and not any(r.graft for r in a.take_outgoing().values())
    a.heartbeat(33.0)
    assert "b" in a.mesh[T], "grafted again once the backoff is over"
    a.leave(T, 40.0)  # a leaves and comes back: its mesh peers were told to back off 10 s
    assert a.take_outgoing()["b"].prune == [(T, 10.0)]
    a.join(T, 41.0)
    assert "b" not in a.mesh[T]
    a.on_rpc("b", Rpc(graft=[T]), 45.0)  # b grafts during them
    out = a.take_outgoing()
    assert "b" not in a.mesh[T] and out["b"].prune and a.score("b", 45.0) < 0


def test_a_graft_before_the_peers_subscription_meshes_it():
    """Batches to a peer travel as concurrent calls: a GRAFT may arrive before the batch that
    announced the topic. Both sides grafting at once must not end in PRUNEs and backoffs."""
    a, b = Router("a"), Router("b")
    for r, other in ((a, "b"), (b, "a")):
        r.add_peer(other, 0.0)
        r.join(T, 0.0)
    hello_b = b.take_outgoing()["a"]  # b's subscription: held back
    a.take_outgoing()
    a.on_rpc("b", Rpc(graft=[T]), 1.0)  # b's GRAFT overtakes it
    assert "b" in a.mesh[T] and not a.take_outgoing().get("b", Rpc()).prune
    a.on_rpc("b", hello_b, 1.1)
    assert "b" in a.mesh[T] and a.topics[T] == {"b"}


def test_gossip_recovers_a_message_the_mesh_missed_and_broken_promises_cost():
    a = Router("a", GossipParams(d=1, d_lo=1, d_hi=1, d_score=0, d_lazy=1, flood_publish=False))
    b = Router("b")
    for peer in ("b", "c"):
        a.add_peer(peer, 0.0)
        a.on_rpc(peer, Rpc(subscribe=[(T, True)]), 0.0)
    b.add_peer("a", 0.0)
    b.join(T, 0.0)
    b.on_rpc("a", Rpc(subscribe=[(T, True)]), 0.0)
    a.join(T, 0.0)
    a.mesh[T] = {"c"}  # b is outside a's mesh: it hears of a's messages only by gossip
    b.mesh[T].clear()
    a.take_outgoing(), b.take_outgoing()
    m = msg(1, 1)
    a.publish(m, 1.0)
    assert [r.messages for r in a.take_outgoing().values()] == [[m]]  # to c only
    a.heartbeat(1.5)
    ihave = a.take_outgoing()["b"].ihave
    assert ihave == [(T, [m.id])]
    b.on_rpc("a", Rpc(ihave=ihave), 1.6)
    iwant = b.take_outgoing()["a"].iwant
    assert iwant == [m.id]
    a.on_rpc("b", Rpc(iwant=iwant), 1.7)
    sent = a.take_outgoing()["b"].messages
    assert sent == [m]
    b.on_rpc("a", Rpc(messages=sent), 1.8)
    ((got, _),) = b.take_to_validate()
    b.validated(got.id, ACCEPT, 1.8)
    assert b.take_delivered() == [m]
    # a promise not kept: b asks for an id a never sends
    b.on_rpc("a", Rpc(ihave=[(T, [msg(1, 2).id])]), 2.0)
    assert b.take_outgoing()["a"].iwant == [msg(1, 2).id]
    before = b.score("a", 2.0)
    b.heartbeat(6.0)  # past iwant_followup
    assert b.score("a", 6.0) < before


def test_a_broken_promise_is_asked_of_another_peer_that_announced_the_message():
    b = Router("b")
    for peer in ("x", "y"):
        b.add_peer(peer, 0.0)
        b.on_rpc(peer, Rpc(subscribe=[(T, True)]), 0.0)
    b.join(T, 0.0)
    b.take_outgoing()
    m = msg(1, 1)
    b.on_rpc("x", Rpc(ihave=[(T, [m.id])]), 1.0)
    b.on_rpc("y", Rpc(ihave=[(T, [m.id])]), 1.0)
    out = b.take_outgoing()
    assert out["x"].iwant == [m.id] and "y" not in out, "asked once"
    b.heartbeat(5.0)  # x never sent it
    assert b.take_outgoing()["y"].iwant == [m.id], "then the other peer that has it"
    b.on_rpc("y", Rpc(messages=[m]), 5.1)
    ((got, _),) = b.take_to_validate()
    b.validated(got.id, ACCEPT, 5.1)
    assert b.take_delivered() == [m]
    assert b.score("y", 5.2) >= 0 > b.score("x", 5.2)


def test_ihave_and_iwant_floods_are_bounded():
    p = GossipParams()
    a = Router("a", p)
    a.add_peer("x", 0.0)
    a.join(T, 0.0)
    a.on_rpc("x", Rpc(subscribe=[(T, True)]), 0.0)
    a.take_outgoing()
    ids = [i.to_bytes(12, "big") for i in range(20_000)]
    for k in range(50):
        a.on_rpc("x", Rpc(ihave=[(T, ids[k * 400 : (k + 1) * 400])] * 20), 1.0)
    asked = a.take_outgoing()["x"].iwant
    assert len(asked) == min(p.max_ihave_length, p.max_iwant_ids), "no more than one IWANT answer holds"
    a.heartbeat(10.0)  # none of them came: the broken promises cost once, not per id
    assert a.score("x", 10.0) == pytest.approx(a.scores.params.behaviour_weight, rel=0.05)
    a.on_rpc("x", Rpc(iwant=ids), 1.0)  # ids we never had: nothing, and no error
    assert "x" not in a.take_outgoing() or not a.take_outgoing().get("x")
    for i in range(1000):
        a.on_rpc("x", Rpc(subscribe=[(f"topic{i}", True)]), 1.0)
    assert len(a.peers["x"]) <= p.max_topics_per_peer


def test_the_seen_cache_and_message_cache_are_bounded():
    a = Router("a", GossipParams(seen_max=1000, history_length=3, history_gossip=2))
    a.join(T, 0.0)
    for i in range(5000):
        a.publish(msg(1, i), i * 0.001)
    assert len(a._seen) <= 1000
    for t in range(1, 5):
        a.heartbeat(10.0 + t)
    assert len(a._mcache) == 0 and len(a._windows) <= 3
    a.heartbeat(200.0)
    assert len(a._seen) == 0  # past seen_ttl


def test_oversized_messages_are_rejected_without_validation():
    a = Router("a", GossipParams(max_message_bytes=100))
    a.add_peer("x", 0.0)
    a.join(T, 0.0)
    a.on_rpc("x", Rpc(messages=[msg(2, 1, b"x" * 101)]), 1.0)
    assert a.take_to_validate() == [] and a.score("x", 1.0) < 0


def test_simulation_delivers_everything_and_survives_a_tenth_killed():
    """The short version of `lattica bench pubsub-sim`: 60 routers, 200 messages, latency 2-30 ms."""
    r = simulate(60, 200, warmup=8.0, seed=7)
    assert r["delivery_pct"] == 100.0, r
    assert r["hops_p99"] <= 8 and r["dup_per_node_msg"] < 6, r
    k = simulate(60, 200, warmup=8.0, seed=8, kill=0.1)
    assert k["killed"] == 6 and k["delivery_pct"] >= 99.9, k


@pytest.mark.slow
def test_simulation_at_the_issue_scale():
    r = simulate(200, 1000)
    assert r["delivery_pct"] == 100.0, r
    k = simulate(200, 1000, kill=0.1)
    assert k["delivery_pct"] >= 99.9, k


def test_a_junk_copy_under_an_honest_id_neither_pre_empts_nor_frames_it():
    """A member sends junk under an honest author's next seqno first: it is another message (the
    id covers data and signature), so the genuine one is still checked, delivered and passed on."""
    a = Router("a")
    for p in ("liar", "honest"):
        a.add_peer(p, 0.0)
        a.on_rpc(p, Rpc(subscribe=[(T, True)]), 0.0)
    a.join(T, 0.0)
    genuine = Envelope(T, b"author", 7, b"real", b"sig-real")
    junk = Envelope(T, b"author", 7, b"junk", b"sig-junk")
    assert junk.id != genuine.id and junk.id[:14] == genuine.id[:14]
    a.on_rpc("liar", Rpc(messages=[junk]), 1.0)
    ((m, _),) = a.take_to_validate()
    a.validated(m.id, REJECT, 1.0)
    a.on_rpc("honest", Rpc(messages=[genuine]), 1.1)
    ((m, _),) = a.take_to_validate()
    assert m == genuine
    a.validated(m.id, ACCEPT, 1.1)
    assert a.take_delivered() == [genuine]
    assert a.score("honest", 1.1) >= 0 > a.score("liar", 1.1)
    other = Router("b")
    other.add_peer("liar", 0.0)
    other.on_rpc("liar", Rpc(messages=[junk] * 3), 1.0)  # a topic it did not join: not even remembered
    assert other.take_to_validate() == [] and not other._seen


def test_prunes_and_grafts_for_topics_we_did_not_join_cost_nothing():
    a = Router("a")
    a.add_peer("x", 0.0)
    a.join(T, 0.0)
    a.take_outgoing()
    a.on_rpc("x", Rpc(prune=[(f"t{i}", 3600.0) for i in range(1000)], graft=[f"g{i}" for i in range(1000)]), 1.0)
    assert len(a._backoff) == 0 and a.take_outgoing() == {}


def test_the_same_copy_again_from_one_peer_earns_no_credit():
    a = Router("a")
    a.add_peer("x", 0.0)
    a.join(T, 0.0)
    a.on_rpc("x", Rpc(subscribe=[(T, True)]), 0.0)
    a.heartbeat(1.0)
    assert "x" in a.mesh[T]
    m = msg(5, 1)
    a.on_rpc("x", Rpc(messages=[m]), 2.0)
    for mm, _ in a.take_to_validate():
        a.validated(mm.id, ACCEPT, 2.0)
    ts = a.scores._peers["x"].topics[T]
    got = ts.mesh_got
    a.on_rpc("x", Rpc(messages=[m] * 50), 2.1)
    assert ts.mesh_got == got


def test_slow_mesh_peers_are_choked_and_announce_instead():
    """A node whose mesh has 6 peers, 3 of which always deliver after the others: after enough
    messages it asks those 3 for IHAVE only; what they then announce first is fetched at once."""
    me = Router("me")
    peers = [f"p{i}" for i in range(6)]
    for p in peers:
        me.add_peer(p, 0.0)
        me.on_rpc(p, Rpc(subscribe=[(T, True)]), 0.0)
    me.join(T, 0.0)
    assert me.mesh[T] == set(peers)
    me.take_outgoing()
    fast, slow = peers[:3], peers[3:]
    for k in range(40):
        m = msg(99, k)
        for i, p in enumerate(fast + slow):  # the fast ones first, each a millisecond after the last
            me.on_rpc(p, Rpc(messages=[m]), 1.0 + k * 0.01 + i * 0.001)
            for mm, _ in me.take_to_validate():
                me.validated(mm.id, ACCEPT, 1.0 + k * 0.01 + i * 0.001)
    me.take_outgoing()
    me.heartbeat(2.0)
    out = me.take_outgoing()
    assert sorted(p for p, r in out.items() if r.choke == [T]) == slow
    # a choked peer's announcement of a message we do not have yet: asked for at once
    new = msg(99, 1000)
    me.on_rpc(slow[0], Rpc(ihave=[(T, [new.id])]), 2.1)
    assert me.take_outgoing()[slow[0]].iwant == [new.id]
    # peers that choked us get our messages as announcements
    me.on_rpc(fast[0], Rpc(choke=[T]), 2.2)
    m2 = msg(98, 1)
    me.on_rpc(fast[1], Rpc(messages=[m2]), 2.3)
    for mm, _ in me.take_to_validate():
        me.validated(mm.id, ACCEPT, 2.3)
    out = me.take_outgoing()
    assert m2 not in out[fast[0]].messages and (T, [m2.id]) in out[fast[0]].ihave
    assert m2 in out[fast[2]].messages


def _mesh_peer_score(share: float, messages: int) -> float:
    from lattica.pubsub._score import PeerScore

    s = PeerScore()
    s.connected("p")
    s.grafted("p", T, 0.0)
    got = 0
    for i in range(1, messages + 1):
        s.topic_message(T, {"p"})
        while got < share * i:
            s.forwarded("p", T)
            got += 1
    return s.score("p", 10.0)


def test_a_mesh_peer_that_never_forwards_is_scored_down_whatever_the_rate():
    from lattica.pubsub._score import ScoreParams

    w = ScoreParams().topic.mesh_deliveries_weight
    for messages in (100, 1000, 10_000):
        silent = _mesh_peer_score(0.0, messages)
        assert w <= silent - 10 / 360 <= w + 0.01, "the whole shortfall costs the weight, at any message rate"
        assert silent < ScoreParams().gossip_threshold
        assert _mesh_peer_score(0.10, messages) >= 0, "an honest peer forwarding a tenth is not penalised"
        assert w / 4 < _mesh_peer_score(0.025, messages) < 0, "half the share: a quarter of the weight"


def test_a_silent_mesh_peer_is_pruned_and_honest_ones_stay():
    routers = net(8, seed=3)
    silent = 1
    for r in routers.values():
        r.join(T, 0.0)
    t = 0.0

    order = random.Random(5)

    def run() -> None:
        """Deliver until quiet, the routers taking turns in a random order each round (as varied
        latencies would have it: no peer is always downstream of another)."""
        for _ in range(20):
            moved = False
            for name in order.sample(list(routers), len(routers)):
                r = routers[name]
                for m, _ in r.take_to_validate():
                    r.validated(m.id, ACCEPT, t)
                for peer, rpc in r.take_outgoing().items():
                    if name == silent:
                        rpc.messages = []  # takes messages, passes none on (its own included: it publishes none)
                    moved = True
                    routers[peer].on_rpc(name, rpc, t)
            if not moved:
                return

    for k in range(400):
        routers[[0, 2, 3][k % 3]].publish(msg([0, 2, 3][k % 3], k), t)
        run()
        t += 0.05
        if k % 20 == 19:
            for r in routers.values():
                r.heartbeat(t)
            run()
    holders = [name for name, r in routers.items() if silent in r.mesh.get(T, ())]
    assert not holders, f"the silent peer is still in the meshes of {holders}"
    assert all(len(r.mesh[T]) >= 4 for name, r in routers.items() if name != silent), "honest meshes stay whole"
    assert all(r.score(p, t) >= 0 for name, r in routers.items() for p in r.mesh[T]), "no honest mesh peer penalised"


def test_the_message_cache_is_bounded_in_bytes():
    r = Router("a", GossipParams(mcache_bytes=10_000, flood_publish=False))
    r.join(T, 0.0)
    for i in range(50):
        r.publish(msg(1, i, b"x" * 1000), 0.0)
    assert r._mcache_bytes <= 10_000 and len(r._mcache) == 10
    assert set(r._mcache) == {msg(1, i, b"x" * 1000).id for i in range(40, 50)}, "the newest kept"
    r.heartbeat(1.0)
    r.publish(msg(1, 99, b"y" * 5000), 1.0)
    assert r._mcache_bytes <= 10_000


def test_a_subscription_holds_a_bounded_number_of_bytes():
    import asyncio

    from lattica.pubsub._subscription import Message, Subscription

    loop = asyncio.new_event_loop()
    try:
        sub = Subscription(T, loop, 1000, lambda s: None, maxbytes=10 << 20)
        for i in range(30):
            sub._push(Message(T, None, i, i), 1 << 20)
        assert sub.dropped == 20 and [sub.get_nowait().seqno for _ in range(10)] == list(range(20, 30))
        sub._push(Message(T, None, 99, 99), 50 << 20)  # one message larger than the bound still arrives
        assert sub.get_nowait().seqno == 99 and sub._bytes == 0
    finally:
        loop.close()


def _replay_setup(**params):
    a = Router("a", GossipParams(seen_max=50, **params))
    a.add_peer("honest", 0.0)
    a.add_peer("flooder", 0.0)
    a.join(T, 0.0)
    return a


def _arrive(r: Router, peer: str, m: Envelope, verdict: str = ACCEPT) -> bool:
    """Hand ``m`` over from ``peer``; whether the router asked for it to be validated."""
    r.on_rpc(peer, Rpc(messages=[m]), 1.0)
    asked = [x for x, _ in r.take_to_validate()]
    for x in asked:
        r.validated(x.id, verdict, 1.0)
    return bool(asked)


def test_a_message_pushed_out_of_the_seen_cache_cannot_be_replayed():
    a = _replay_setup()
    old = msg(7, 1_000)
    assert _arrive(a, "honest", old)
    for i in range(60):  # a flood signed by 60 throwaway authors pushes it out of the cache
        _arrive(a, "flooder", msg(1000 + i, 5), verdict=IGNORE)
    assert old.id not in a._seen
    assert not _arrive(a, "flooder", old)  # the replay is dropped unseen
    a.on_rpc("flooder", Rpc(ihave=[(T, [old.id])]), 1.0)
    assert old.id not in a.take_outgoing().get("flooder", Rpc()).iwant  # and not asked for
    assert _arrive(a, "honest", msg(7, 1_001))  # the author's newer messages still go


def test_only_accepted_messages_raise_their_author_s_floor_and_floors_are_bounded():
    a = _replay_setup(max_floors=10)
    assert _arrive(a, "flooder", msg(9, 1_000), verdict=REJECT)
    for i in range(60):
        _arrive(a, "flooder", msg(1000 + i, 5), verdict=IGNORE)
    assert a._floors == {}  # a rejected or ignored message vouches for no author
    for i in range(200):  # 200 accepted authors forgotten: at most 10 floors kept
        _arrive(a, "honest", msg(2000 + i, 5))
    assert len(a._floors) == 10


# -- flood sets: the peers an author sent its message to itself ------------------------------------


def _named(n: int, seed: int = 1, links=None) -> dict:
    """``n`` routers whose peers sign as their 4-byte names (so authors can name them)."""
    routers = {i: Router(i, rng=random.Random(seed + i), peer_bytes=lambda p: p.to_bytes(4, "big")) for i in range(n)}
    for i in routers:
        for j in routers:
            if i < j and (links is None or (i, j) in links):
                routers[i].add_peer(j, 0.0)
                routers[j].add_peer(i, 0.0)
    for r in routers.values():
        r.join(T, 0.0)
    wire(routers, 0.0)
    for t in (1.0, 2.0, 3.0):  # (the meshes form on the heartbeats)
        for r in routers.values():
            r.heartbeat(t)
        wire(routers, t)
    assert all(len(r.mesh[T]) >= GossipParams().d_lo for r in routers.values())
    return routers


def _flooded(routers: dict, author: int, seq: int, now: float) -> Envelope:
    return Envelope(T, author.to_bytes(4, "big"), seq, b"hi", flooded=routers[author].flood_set(T, now))


def _copies(routers: dict, now: float, drop=lambda src, dst, m: False) -> dict:
    """Like ``wire``, counting the copies of messages each router receives."""
    got = {name: 0 for name in routers}
    for _ in range(20):
        moved = False
        for name, r in routers.items():
            for m, _ in r.take_to_validate():
                r.validated(m.id, ACCEPT, now)
            for peer, rpc in r.take_outgoing().items():
                rpc.messages = [m for m in rpc.messages if not drop(name, peer, m)]
                got[peer] += len(rpc.messages)
                moved = True
                routers[peer].on_rpc(name, rpc, now)
        if not moved:
            break
    return got


def test_forwarders_spare_the_peers_the_author_flooded():
    routers = _named(6)
    m = _flooded(routers, 0, 1, 5.0)
    assert m.flooded == {flood_tag(i.to_bytes(4, "big")) for i in range(1, 6)}
    routers[0].publish(m, 5.0)
    got = _copies(routers, 5.0)
    assert [got[i] for i in range(1, 6)] == [1] * 5, "each subscriber gets the author's copy and no forward"
    assert all(r.take_delivered() == [m] for r in routers.values())
    plain = Envelope(T, (0).to_bytes(4, "big"), 2, b"hi")  # no flood set: forwarded as before
    routers[0].publish(plain, 5.5)
    assert sum(_copies(routers, 5.5).values()) > 5


def test_a_peer_not_in_the_flood_set_still_gets_forwards():
    links = {(i, j) for i in range(6) for j in range(i + 1, 6)} - {(0, 5)}  # the author does not know 5
    routers = _named(6, links=links)
    m = _flooded(routers, 0, 1, 5.0)
    assert flood_tag((5).to_bytes(4, "big")) not in m.flooded
    routers[0].publish(m, 5.0)
    got = _copies(routers, 5.0)
    assert [got[i] for i in range(1, 5)] == [1] * 4 and got[5] >= 1
    assert routers[5].take_delivered() == [m]


def test_a_peer_named_but_never_sent_to_gets_the_message_after_a_heartbeat():
    routers = _named(6)
    m = _flooded(routers, 0, 1, 5.0)
    routers[0].publish(m, 5.0)
    _copies(routers, 5.0, drop=lambda src, dst, _m: src == 0 and dst == 5)  # the author lied about 5
    assert routers[5].take_delivered() == [], "no forwarder sent it to a peer the author named"
    for name, r in routers.items():
        r.heartbeat(6.0)
    _copies(routers, 6.0)
    assert routers[5].take_delivered() == [m], "its mesh peers told it at the heartbeat, and it asked"


def test_mesh_peers_are_not_penalised_for_sparing_us_what_the_author_sent_us():
    routers = _named(8, seed=4)
    t = 5.0
    for k in range(600):
        author = k % 2  # (peers that publish forward their own messages: two authors, the others only forward)
        routers[author].publish(_flooded(routers, author, k, t), t)
        _copies(routers, t)
        t += 0.05
        if k % 20 == 19:
            for r in routers.values():
                r.heartbeat(t)
            _copies(routers, t)
    for name, r in routers.items():
        assert len(r.mesh[T]) >= GossipParams().d_lo, f"router {name} pruned its mesh: {r.mesh[T]}"
        assert all(r.score(p, t) >= 0 for p in r.mesh[T]), f"router {name} penalised a mesh peer"


def test_ids_that_left_the_message_cache_are_not_named_at_the_heartbeat():
    """A forwarder names at its heartbeat only what it can still send: an IWANT it could not
    answer would cost it (P7) at the peer that asked."""
    routers = _named(6)
    victim, t = 5, 5.0
    m = _flooded(routers, 0, 1, t)
    routers[0].publish(m, t)
    for k in range(70):  # 70 MiB more push m out of every message cache (64 MiB)
        routers[0].publish(
            Envelope(T, (0).to_bytes(4, "big"), 100 + k, b"x", size=1 << 20, flooded=routers[0].flood_set(T, t)), t
        )
    _copies(routers, t, drop=lambda src, dst, x: src == 0 and dst == victim and x.id == m.id)  # the author's lie
    assert not any(m.id in r._mcache for r in routers.values())
    for t in range(6, 14):
        for r in routers.values():
            r.heartbeat(float(t))
        _copies(routers, float(t))
    assert all(routers[victim].score(p, float(t)) >= 0 for p in range(5)), "no honest peer broke a promise"


def test_a_burst_cannot_choose_which_ids_go_unnamed_at_the_heartbeat():
    r = Router(0, GossipParams(max_ihave_length=100), rng=random.Random(1))
    ids = [i.to_bytes(20, "big") for i in range(10_000)]
    for mid in ids:
        r._defer(7, T, mid)
    kept = r._later[0][7][T][1]
    assert len(kept) == 100
    assert sum(1 for mid in kept if int.from_bytes(mid, "big") >= 5000) > 30, (
        "the later half is sampled too, not only the first ids"
    )


# -- libp2p messages: the seen cache's time, whatever came since -----------------------------------


def _lp(author: int, seq: int) -> Envelope:
    """A libp2p GossipSub message as the glue hands it over (its signature checked)."""
    return Envelope(T, author.to_bytes(4, "big"), seq, b"x", b"", LIBP2P_MARK)


def _at(r: Router, peer: str, m: Envelope, now: float) -> bool:
    """``_arrive`` at ``now``: whether the router took ``m`` (asked for it to be validated)."""
    r.on_rpc(peer, Rpc(messages=[m]), now)
    asked = [x for x, _ in r.take_to_validate()]
    for x in asked:
        r.validated(x.id, ACCEPT, now)
    return bool(asked)


def test_a_libp2p_message_pushed_out_of_the_seen_cache_is_refused_until_its_seen_ttl():
    """libp2p messages raise no author's floor (js's seqnos are random): a flood under throwaway
    authors pushes one out of the cache's 50 entries, and its replay within the 120 s is refused
    all the same (the tail); after the 120 s it is a new message, as in libp2p."""
    a = _replay_setup()
    old = _lp(7, 1)
    assert _at(a, "honest", old, 1.0)
    for i in range(60):
        assert _at(a, "flooder", _lp(1000 + i, 1), 2.0)
    assert old.id not in a._seen and a._tail is not None and old.id in a._tail
    assert not _at(a, "flooder", old, 60.0)
    a._expire(119.0)
    assert not _at(a, "flooder", old, 119.0)
    a._expire(140.0)
    assert a._tail is not None and len(a._tail) == 0
    assert _at(a, "honest", old, 140.0)


def test_when_the_tail_is_full_too_peers_new_libp2p_messages_are_dropped_not_old_ids_forgotten():
    """The cache (50) and the tail (10) hold 60 unexpired libp2p ids: a peer's new message, which
    would push one out for good, is dropped instead (nobody blamed); every id held stays refused;
    once they age out, new messages are taken again."""
    a = _replay_setup(seen_tail_max=10)
    for i in range(60):
        assert _at(a, "flooder", _lp(1000 + i, 1), 1.0)
    assert a._tail is not None and len(a._tail) == 10 and len(a._seen) == 50
    assert not _at(a, "honest", _lp(5000, 1), 2.0)
    assert not any(_at(a, "flooder", _lp(1000 + i, 1), 3.0) for i in range(60))
    assert a.scores.score("honest", 3.0) >= 0
    a._expire(130.0)
    assert len(a._seen) == 0 and len(a._tail) == 0
    assert _at(a, "honest", _lp(5000, 1), 130.0)


def test_the_tail_keeps_ids_in_buckets_by_time_and_forgets_them_after_its_ttl(monkeypatch):
    """Ids sealed into sorted buckets (here every 3 ids, and every 10 s) are all still found;
    each bucket goes ttl after its last id came."""
    from lattica.pubsub import _seen

    monkeypatch.setattr(_seen, "_SEAL", 3)
    tail = _seen.Tail(120.0, 100)
    ids = [bytes([i]) * 20 for i in range(10)]
    for i, mid in enumerate(ids):
        assert tail.add(mid, float(i))
    assert len(tail._sealed) == 3 and len(tail) == 10
    assert all(mid in tail for mid in ids) and b"other" not in tail
    tail.expire(122.5)  # (the first bucket's last id came at 2.0)
    assert ids[0] not in tail and ids[3] in tail and len(tail) == 7
    tail.expire(200.0)
    assert len(tail) == 0 and not any(mid in tail for mid in ids)
    full = _seen.Tail(120.0, 2)
    assert full.add(b"a", 0.0) and full.add(b"b", 0.0) and not full.add(b"c", 0.0) and full.full()
