"""Membership state machines (sans-IO): detection, refutation, leaving, hostile messages."""

from __future__ import annotations

from lattica._membership import (
    ALIVE,
    DEAD,
    LEFT,
    MAX_INCARNATION,
    SUSPECT,
    MemberDown,
    MembershipConfig,
    PhiAccrual,
    SelfDowned,
    statement,
)
from lattica._membership import Membership as _Membership
from lattica.bench.membership import SimNotary

NOTARY = SimNotary()  # real Ed25519 signatures, one key per member name


def Membership(me, info=None, config=None):
    return _Membership(me, info, config, notary=NOTARY.for_member(me))


def row(mid, inc, state, info=None):
    """A rumor as member ``mid`` (alive, left: sealed by it) or anyone (suspect, dead) writes it."""
    info = info or {}
    proof = NOTARY.for_member(mid).seal(statement(mid, inc, state, info)) if state in (ALIVE, LEFT) else None
    return [mid, inc, state, info, proof]


def test_phi_stays_low_on_time_and_grows_with_silence():
    d = PhiAccrual(0.5, min_std=0.1, acceptable_pause=0.3)
    t = 0.0
    for _ in range(20):
        d.heartbeat(t)
        t += 0.5
    assert d.phi(t - 0.5 + 0.5) < 1  # the next one is due now
    assert d.phi(t - 0.5 + 1.5) > 8  # 1 s late (0.7 s beyond the acceptable pause): suspicious
    assert d.phi(t + 5) > d.phi(t + 2) > d.phi(t + 1)


def _pair(cfg=None):
    a, b = Membership("a", {"cpu": 2}, cfg), Membership("b", {"cpu": 4}, cfg)
    a.add(0.0, "b")
    b.add(0.0, "a")
    return a, b


def _run(nodes, until, start=0.0, step=0.05, frozen=(), cut=()):
    """Tick every node every interval (messages arrive 1 ms later, none across a ``cut`` link);
    collect events per node."""
    events = {n.me.id: [] for n in nodes}
    by_id = {n.me.id: n for n in nodes}
    interval = nodes[0].cfg.interval
    t, next_tick = start, {n.me.id: start for n in nodes}
    inbox = []
    while t <= until:
        for when, src, dst, msg in [m for m in inbox if m[0] <= t]:
            inbox.remove((when, src, dst, msg))
            if dst not in frozen:
                events[dst] += by_id[dst].receive(t, src, msg)
        for n in nodes:
            if n.me.id in frozen or t < next_tick[n.me.id]:
                continue
            next_tick[n.me.id] = t + interval
            out, evs = n.tick(t)
            events[n.me.id] += evs
            inbox += [(t + 0.001, n.me.id, to, msg) for to, msg in out if to in by_id and {n.me.id, to} not in cut]
        t = round(t + step, 6)
    return events


def test_a_frozen_member_is_suspected_then_declared_dead():
    a, b = _pair()
    _run([a, b], 3.0)
    assert a.get("b").state == ALIVE and a.get("b").info == {"cpu": 4}  # info travels with gossip
    ev = _run([a, b], 7.0, start=3.05, frozen={"b"})
    downs = [e for e in ev["a"] if isinstance(e, MemberDown)]
    assert len(downs) == 1 and downs[0].member.id == "b" and downs[0].reason == "unreachable"
    assert a.get("b").state == DEAD
    assert 3.05 + 1.0 < a.get("b").since < 3.05 + 3.5  # suspected after ~1 s, dead ~1 s later


def test_other_traffic_from_a_member_keeps_it_alive_while_its_heartbeats_are_held_up():
    """A heartbeat can wait behind a large transfer on the same connection: bytes from the member
    (fed by the glue from the connection) are as good a sign of life, and only silence counts."""
    a, b = _pair()
    _run([a, b], 3.0)
    t = 3.05
    while t < 8.0:  # b's heartbeats do not arrive, but its other bytes do
        a.heard(t, "b")
        _, events = a.tick(t)
        assert not events
        t += 0.05
    assert a.get("b").state == ALIVE and "b" in a.watched()
    ev = _run([a, b], 11.0, start=8.0, frozen={"b"})  # now nothing arrives at all
    assert a.get("b").state == DEAD and any(isinstance(e, MemberDown) for e in ev["a"])


def test_a_suspected_member_refutes_with_a_newer_incarnation():
    a, b = _pair()
    _run([a, b], 2.0)
    a.members["b"].state, a.members["b"].since = SUSPECT, 2.0  # as if a had missed heartbeats
    a._spread("b")
    _run([a, b], 3.0, start=2.05)
    assert b.me.incarnation == 1  # b heard the suspicion about itself
    assert a.get("b").state == ALIVE and a.get("b").incarnation == 1


def test_leaving_is_known_at_once_and_is_not_an_error():
    a, b = _pair()
    _run([a, b], 2.0)
    events = a.receive(2.1, "b", b.leave())
    assert [(e.member.id, e.reason) for e in events if isinstance(e, MemberDown)] == [("b", "left")]
    assert a.get("b").state == LEFT
    assert a.receive(2.2, "b", {"hb": True}) == []  # a late heartbeat does not resurrect it


def test_declared_dead_by_outside_evidence_at_once():
    a, b = _pair()
    ev = a.declare_dead(1.0, "b", "connection refused")
    assert [(e.member.id, e.reason) for e in ev] == [("b", "connection refused")]
    assert a.declare_dead(1.1, "b", "again") == []


def test_a_dead_member_comes_back_only_in_a_newer_incarnation():
    a, b = _pair()
    a.declare_dead(1.0, "b", "test")
    assert a.receive(1.1, "b", {"rumors": [row("b", 0, ALIVE, {})]}) == []
    ev = a.receive(1.2, "b", {"rumors": [row("b", 1, ALIVE, {"cpu": 8})]})
    assert a.get("b").state == ALIVE and a.get("b").info == {"cpu": 8} and ev


def test_a_member_back_from_the_dead_without_hearing_it_is_told_its_verdict():
    # b was frozen: a declared it dead; thawed, b hears a suspicion first and comes back alive in
    # a newer incarnation, which a accepts (a is the only other member: its word is enough). b must still learn it had
    # been declared dead (its supervised actors were restarted elsewhere meanwhile).
    a, b = _pair()
    a.declare_dead(1.0, "b", "frozen")
    b.receive(1.5, "a", {"rumors": [row("b", 0, SUSPECT, {})]})  # (a's suspicion reached b first)
    assert b.me.incarnation == 1
    a.receive(1.6, "b", {"rumors": [row("b", 1, ALIVE, {})]})
    assert a.get("b").state == ALIVE
    out, _ = a.tick(1.7)
    told = [msg for to, msg in out if to == "b" and row("b", 0, DEAD, {}) in msg.get("rumors", [])]
    assert len(told) == 1
    events = b.receive(1.8, "a", told[0])
    assert [type(e) for e in events] == [SelfDowned]
    assert b.me.incarnation == 1  # an old verdict: nothing left to refute
    assert b.receive(1.9, "a", told[0]) == []  # told once


def test_one_members_word_does_not_take_a_live_node_out_of_the_mesh():
    """A verdict heard, not seen, counts once two members said it: one lying member cannot
    make the others drop a node, nor make the node stop its own children."""
    a = Membership("a", {})
    for m in ("b", "c", "y"):
        a.add(0.0, m)
    assert a.receive(1.0, "b", {"rumors": [row("y", 0, DEAD, {})]}) == []
    assert a.get("y").state == ALIVE
    assert a.receive(1.0, "b", {"rumors": [row("y", 0, DEAD, {})]}) == []  # saying it twice is still one member
    events = a.receive(1.2, "c", {"rumors": [row("y", 0, DEAD, {})]})  # a second member: it stands
    assert a.get("y").state == DEAD and [type(e) for e in events] == [MemberDown]
    y = Membership("y", {})
    for m in ("a", "b", "c"):
        y.add(0.0, m)
    y.tick(0.5)  # (a, b and c all watch y: even a watcher's word alone is not enough)
    assert [type(e) for e in y.receive(1.0, "a", {"rumors": [row("y", 0, DEAD, {})]})] == []
    assert y.me.incarnation == 1  # refuted, children kept
    assert [type(e) for e in y.receive(1.1, "b", {"rumors": [row("y", 0, DEAD, {})]})] == [SelfDowned]  # two accusers


def test_hearsay_cannot_name_an_incarnation_a_member_never_had():
    """Only a member raises its own incarnation: a suspicion or verdict naming a newer one than
    we know (2^48 - 1 left the victim no number to refute with) is forged and ignored."""
    a = Membership("a", {})
    for m in ("b", "c", "y"):
        a.add(0.0, m)
    a.receive(0.5, "y", {"rumors": [row("y", 3, ALIVE, {})]})
    for inc in (4, MAX_INCARNATION - 1):
        assert a.receive(1.0, "b", {"rumors": [row("y", inc, SUSPECT, {})]}) == []
        assert a.receive(1.0, "c", {"rumors": [row("y", inc, DEAD, {})]}) == []
    assert a.get("y").state == ALIVE and a.get("y").incarnation == 3
    assert a.receive(1.1, "b", {"rumors": [row("y", 3, SUSPECT, {})]})  # the incarnation it has: fine
    y = Membership("y", {})
    y.add(0.0, "b")
    assert y.receive(1.0, "b", {"rumors": [row("y", MAX_INCARNATION - 1, SUSPECT, {})]}) == []
    assert y.me.incarnation == 0  # not pushed to the edge
    y.receive(1.0, "b", {"rumors": [row("y", 5, DEAD, {})]})  # a restarted node's old verdict: a small step
    assert y.me.incarnation == 6


def test_hostile_messages_are_ignored():
    a, _ = _pair()
    for msg in (
        None,
        [],
        "x",
        {"rumors": "no"},
        {"rumors": [1, [1, 2], row("c", "x", ALIVE, {}), row("c", 1, "zombie", {})]},
        {"rumors": [row("c", 0, ALIVE, {str(i): i for i in range(100)})]},
        {"view": [row("d", -1 << 70, DEAD, {})]},
    ):
        a.receive(0.5, "b", msg)
    assert set(a.members) == {"b"}
    many = {"rumors": [row(f"m{i}", 0, ALIVE, {}) for i in range(1000)]}
    a.receive(0.6, "b", many)
    assert len(a.members) <= 1 + 32  # at most 32 rumors are read from one message


def test_watchers_follow_the_ring_and_dropped_ones_are_told():
    cfg = MembershipConfig(monitors=2)
    nodes = [Membership(f"n{i}", {}, cfg) for i in range(6)]
    for n in nodes[1:]:
        n.add(0.0, "n0")
    _run(nodes, 6.0)
    assert all(len(n.alive()) == 5 for n in nodes)
    # every member is watched (has a detector) by exactly its 2 ring predecessors' choice
    watched_by = {n.me.id: [m.me.id for m in nodes if n.me.id in m._detectors] for n in nodes}
    assert all(len(w) == 2 for w in watched_by.values()), watched_by


def test_a_link_closed_on_purpose_is_not_a_failure():
    """Two members stop talking directly (one disconnected the other; neither dials for
    membership): they drop each other as watcher and watched, and a third keeps judging both. A
    watcher told nothing would see silence and, refuted or not, end up declaring a live member
    dead; that is the control half of this test."""
    for told in (True, False):
        nodes = [Membership(x, {}, MembershipConfig(monitors=2)) for x in "abc"]
        for n in nodes[1:]:
            n.add(0.0, "a")
        _run(nodes, 3.0)
        a, b, c = nodes
        assert all(len(n.alive()) == 2 for n in nodes)
        a.reachable = lambda mid: mid != "b"
        b.reachable = lambda mid: mid != "a"
        if told:
            a.link_closed("b")
            b.link_closed("a")
        ev = _run(nodes, 12.0, start=3.05, cut=[{"a", "b"}])
        downs = [e for evs in ev.values() for e in evs if isinstance(e, MemberDown)]
        if told:
            assert downs == [] and all(m.state == ALIVE for n in nodes for m in n.members.values())
            assert "a" in c._detectors and "b" in c._detectors
        else:
            assert downs, "an untold watcher should have judged a silent link as a failure"


def test_a_peer_met_by_a_link_and_never_heard_from_is_gone_with_the_link():
    """An observer (a member by its credentials that runs no membership, e.g. ``lattica
    status``) connects and leaves: nobody ever hears it, so nobody would judge it; it leaves the
    view with its link, quietly. A member that did speak stays, judged by the others as before;
    one whose statement comes later is taken back by it."""
    a = Membership("a", {}, MembershipConfig())
    a.add(0.0, "observer")
    assert [m.id for m in a.alive()] == ["observer"]
    assert a.link_closed("observer") == []  # (forgotten quietly: no verdict, nothing reacts as to a death)
    assert a.get("observer") is None and a.alive() == []
    nodes = [Membership(x, {}, MembershipConfig()) for x in "ab"]
    nodes[1].add(0.0, "a")
    _run(nodes, 2.0)
    assert nodes[1].link_closed("a") == [] and nodes[1].get("a").state == ALIVE
    late = Membership("c", {}, MembershipConfig())
    late.add(0.0, "a")
    late.link_closed("a")  # (closed before a's statement came)
    assert late.get("a") is None
    late.add(2.0, "b")
    nodes[1].add(2.0, "c")
    _run([*nodes, late], 4.0, start=2.05)  # b's view, with a's own statement, reaches c
    assert late.get("a") is not None and late.get("a").state == ALIVE


def test_hearsay_of_death_or_departure_does_not_outweigh_our_own_detector():
    """Another member says b is dead or left; a still hears b's heartbeats, so a keeps b alive
    (only our own detector, or b itself saying goodbye, takes it down)."""
    a, b = _pair()
    _run([a, b], until=3.0)  # b heartbeats to a: a's detector for b is fresh
    for state in (DEAD, LEFT):
        events = a.receive(3.0, "c", {"rumors": [["b", 9, state, {}]]})
        assert not any(isinstance(e, MemberDown) for e in events)
        assert a.get("b").state == ALIVE
    bye = b.leave()
    assert any(isinstance(e, MemberDown) for e in a.receive(3.1, "b", bye))  # b itself: believed
    assert a.get("b").state == LEFT


def test_a_member_held_down_by_one_that_cannot_reach_it_refutes_through_those_that_can():
    """d lost its own link to c (c is behind a NAT) and suspects it; a and b hear c's heartbeats,
    so they do not believe d, and they tell c, which refutes in a newer incarnation that reaches d
    through them. (Were c never told, d would hold it dead until it forgot it.)"""
    nodes = {n: Membership(n) for n in "abcd"}
    for x in nodes.values():
        for y in nodes:
            x.add(0.0, y)
    nodes["c"].reachable = lambda m: m != "d"
    nodes["d"].reachable = lambda m: m != "c"
    everyone, apart = list(nodes.values()), [{"c", "d"}]
    _run(everyone, 3.0, cut=apart)
    c, d = nodes["c"], nodes["d"]
    assert d.get("c").state == ALIVE and set(c.watched()) == {"a", "b"} and "c" not in d.watched()
    d.suspect(3.0, "c")
    ev = _run(everyone, 6.0, start=3.05, cut=apart)
    assert c.me.incarnation == 1  # told of the suspicion by a or b
    assert all(n.get("c").state == ALIVE and n.get("c").incarnation == 1 for n in everyone)
    # (d's own suspicion may time out into a verdict before the refutation is back: d alone)
    assert not any(isinstance(e, MemberDown) for n in "abc" for e in ev[n])
    assert not any(isinstance(e, SelfDowned) for e in ev["c"])  # a suspicion passed on is no verdict


def test_a_suspicion_passed_on_to_its_member_names_only_its_current_incarnation():
    """A member with evidence that b is alive passes on only suspicions of b's incarnation it
    knows (an old or invented one is dropped, so nobody can drive b's incarnation up by it)."""
    a, b = _pair()
    _run([a, b], until=3.0)
    for inc in (1, 7):
        a.receive(3.0, "c", {"rumors": [["b", inc, SUSPECT, {}, None]]})
        assert not [
            m
            for to, m in a.tick(3.01)[0]
            if to == "b" and any(r[0] == "b" and r[2] == SUSPECT for r in m.get("rumors", []))
        ]
    a.receive(3.1, "c", {"rumors": [["b", 0, DEAD, {}, None]]})
    told = [
        m for to, m in a.tick(3.2)[0] if to == "b" and any(r[0] == "b" and r[2] == SUSPECT for r in m.get("rumors", []))
    ]
    assert len(told) == 1 and a.get("b").state == ALIVE
    b.receive(3.3, "a", told[0])
    assert b.me.incarnation == 1


def test_rows_about_us_cannot_drive_our_incarnation_up():
    """A member sends us rows that we are suspect or dead in ever newer incarnations (a whole view
    of them, message after message): we refute at most once a round, and an incarnation we never
    stated (a previous run of ours the mesh remembers) is jumped to at most once a minute."""
    from lattica._membership import MAX_JUMP

    me = Membership("me")
    me.add(0.0, "liar")
    me.add(0.0, "other")
    view = [["me", i, SUSPECT if i % 2 else DEAD, {}, None] for i in range(0, 4096 * MAX_JUMP, MAX_JUMP)]
    me.receive(1.0, "liar", {"view": view})
    assert me.me.incarnation == MAX_JUMP + 1 or me.me.incarnation == 1  # one refutation (a jump, or of 0)
    first = me.me.incarnation
    t = 1.0
    for _ in range(100):  # 50 s of rounds, each with a view of ever higher incarnations
        t += 0.5
        me.tick(t)
        me.receive(
            t,
            "liar",
            {"view": [["me", me.me.incarnation + k, SUSPECT, {}, None] for k in range(0, 64 * MAX_JUMP, MAX_JUMP)]},
        )
    assert me.me.incarnation <= first + 100  # only rows naming our own incarnation, once a round
    t += 60.0
    me.tick(t)
    me.receive(t, "liar", {"rumors": [["me", me.me.incarnation + MAX_JUMP, SUSPECT, {}, None]]})
    assert me.me.incarnation > first + MAX_JUMP  # a minute later, one jump again (a restart must be able to)


def test_a_suspicion_is_not_passed_on_to_a_member_that_left_meanwhile():
    a, b = _pair()
    _run([a, b], until=3.0)
    a.receive(3.0, "c", {"rumors": [["b", 0, SUSPECT, {}, None]]})  # queued: a still hears b
    a.receive(3.01, "b", b.leave())
    assert a.get("b").state == LEFT
    assert not [m for to, m in a.tick(3.1)[0] if to == "b"]


def test_hearsay_about_a_member_we_do_not_watch_still_spreads():
    a = Membership("a")
    a.receive(0.0, "c", {"rumors": [row("x", 0, ALIVE, {})]})
    events = a.receive(1.0, "c", {"rumors": [row("x", 0, DEAD, {})]})
    assert any(isinstance(e, MemberDown) for e in events) and a.get("x").state == DEAD


def test_rumors_with_huge_incarnations_bad_rows_or_past_the_table_bound_are_skipped():
    from lattica import _membership as mb

    a = Membership("a")
    a.receive(0.0, "c", {"rumors": [row("x", 2**64 - 1, ALIVE, {}), row("y", 1 << 48, ALIVE, {})]})
    assert a.get("x") is None and a.get("y") is None
    bad_rows = [
        {"cpu": "lots"},
        {"cpu": float("inf")},
        {"memory": -1},
        {"gpus": 1e300},
        {"labels": {"zone": 3}},
        {"labels": "eu"},
        {"load": {"actors": "many"}},
        {"load": {"reserved": {"cpu": float("nan")}}},
    ]
    for i, info in enumerate(bad_rows):
        a.receive(0.0, "c", {"rumors": [row(f"bad{i}", 0, ALIVE, info)]})
    assert not any(m.startswith("bad") for m in a.members)
    a.receive(
        0.0,
        "c",
        {
            "rumors": [
                row(
                    "good",
                    0,
                    ALIVE,
                    {
                        "cpu": 8,
                        "memory": 1 << 34,
                        "labels": {"zone": "eu"},
                        "load": {"actors": 3, "reserved": {"cpu": 2}},
                    },
                )
            ]
        },
    )
    assert a.get("good").info["cpu"] == 8
    old = mb.MAX_MEMBERS
    mb.MAX_MEMBERS = len(a.members) + 2
    try:
        for i in range(0, 40, 8):
            a.receive(0.0, "c", {"view": [row(f"n{i + j}", 0, ALIVE, {}) for j in range(8)]})
        assert len(a.members) == mb.MAX_MEMBERS and a.add(0.0, "one-more") == []
    finally:
        mb.MAX_MEMBERS = old


def test_only_a_member_speaks_for_itself():
    """Alive and left are a member's own sealed statements: a row about b that b did not seal
    (or sealed for other words) moves nothing; b's own, passed on by anyone, is believed; a
    suspicion names no one new."""
    a = Membership("a", {})
    a.add(0.0, "c")
    a.receive(0.0, "c", {"rumors": [row("b", 2, ALIVE, {"cpu": 4})]})  # b's own statement, relayed by c
    assert a.get("b").incarnation == 2 and a.get("b").info == {"cpu": 4}
    forged = [
        ["b", 3, ALIVE, {"cpu": 1000}, None],
        ["b", 3, ALIVE, {"cpu": 1000}, NOTARY.for_member("c").seal(statement("b", 3, ALIVE, {"cpu": 1000}))],
        ["b", 3, ALIVE, {"cpu": 1000}, row("b", 3, ALIVE, {"cpu": 4})[4]],  # b's seal on other info
        ["b", 2, LEFT, {}, row("b", 2, ALIVE, {"cpu": 4})[4]],
    ]
    assert a.receive(1.0, "c", {"rumors": forged}) == []
    assert (a.get("b").state, a.get("b").incarnation, a.get("b").info) == (ALIVE, 2, {"cpu": 4})
    assert a.receive(1.0, "c", {"rumors": [row("x", 0, SUSPECT, {})]}) == [] and a.get("x") is None
    events = a.receive(1.1, "c", {"rumors": [row("b", 2, LEFT, {})]})  # b's goodbye: one relay is enough
    assert [type(e) for e in events] == [MemberDown] and a.get("b").state == LEFT


def test_new_info_comes_in_a_new_incarnation_so_old_statements_cannot_be_replayed():
    a, b = _pair()
    _run([a, b], 2.0)
    first = [r for r in b._news() if r[0] == "b"][0]
    b.update_info({"cpu": 64})
    assert b.me.incarnation == first[1] + 1
    _run([a, b], 4.0, start=2.05)
    assert a.get("b").info == {"cpu": 64}
    assert a.receive(4.1, "b", {"rumors": [first]}) == [] and a.get("b").info == {"cpu": 64}
