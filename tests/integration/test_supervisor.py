"""lattica.Supervisor: children placed across the mesh, restarted by strategy, elsewhere when
their node dies, with their checkpointed state; stable refs follow them; escalation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for
from lattica.mesh.process import ServerProcess

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support")


@contextlib.contextmanager
def _mesh(n: int):
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(lattica.Node([TCP], allow=ALLOW, resources={"cpu": 4})) for _ in range(n)]
        for i, node in enumerate(nodes[1:], 1):
            for m in nodes[:i]:
                node.connect(m.addrs[0])
        for node in nodes:
            lattica.dht.bootstrap(node=node).result(10)
        assert wait_for(
            lambda: all(len(x.nodes()) == n and all("cpu" in r for r in x.nodes()) for x in nodes), timeout=10
        )
        yield nodes


def _sup(node, **kw):
    async def go():
        sup = lattica.Supervisor.remote(**kw)
        await sup.children.remote()
        return sup

    return node.run(go(), timeout=30)


def _call(node, ref, method, *args, timeout=30, **kwargs):
    async def go():
        return await getattr(ref, method).remote(*args, **kwargs)

    return node.run(go(), timeout=timeout)


def test_children_spread_and_one_for_one_restarts_only_the_dead_child_in_place():
    with _mesh(3) as (a, b, c):
        sup = _sup(a, strategy="one_for_one", max_restarts=5, within=60)
        refs = [_call(a, sup, "start_child", sa.Tally, [f"w{i}"]) for i in range(3)]
        assert len({r.peer_id for r in refs}) == 3  # spread: one per node
        assert all(r.stable for r in refs)
        where = {_call(a, r, "where") for r in refs}
        assert where == {str(n.peer_id) for n in (a, b, c)}
        _call(a, refs[0], "add", 5)
        before = [_call(a, r, "where") for r in refs]
        on = next(n for n in (a, b, c) if str(n.peer_id) == before[1])
        on.run(lattica.akill(lattica.ActorRef(on.peer_id, refs[1].name, refs[1].methods)), timeout=10)
        assert wait_for(lambda: _call(a, sup, "which_children")[1]["restarts"] == 1, timeout=10)
        kids = _call(a, sup, "which_children")
        assert [k["restarts"] for k in kids] == [1 if i == 1 else 0 for i in range(3)]
        assert _call(a, refs[0], "get") == 5  # the others were left alone
        assert _call(a, refs[1], "get") == 0  # a fresh incarnation (no checkpoints asked for)
        hist = _call(a, sup, "history")
        assert [h["event"] for h in hist] == ["down", "restarted"] and hist[0]["reason"] == "killed"


def test_one_for_all_and_rest_for_one_restart_their_groups_in_order():
    with _mesh(2) as (a, b):
        for strategy, expect in (("one_for_all", [1, 1, 1]), ("rest_for_one", [0, 1, 1])):
            sup = _sup(a, strategy=strategy, max_restarts=5, within=60)
            refs = [_call(a, sup, "start_child", sa.Tally, [], id=f"k{i}") for i in range(3)]
            _call(a, refs[0], "add", 1)
            victim = _call(a, sup, "which_children")[1]
            node = a if victim["node"] == str(a.peer_id) else b
            node.run(lattica.akill(lattica.ActorRef(node.peer_id, refs[1].name, refs[1].methods)), timeout=10)
            assert wait_for(lambda: [k["restarts"] for k in _call(a, sup, "which_children")] == expect, timeout=10), (
                strategy
            )
            assert _call(a, refs[0], "get") == (0 if strategy == "one_for_all" else 1)
            a.run(lattica.akill(sup), timeout=10)


def test_restart_types_and_escalation_past_the_restart_intensity():
    with _mesh(2) as (a, b):
        sup = _sup(a, strategy="one_for_one", max_restarts=2, within=60)
        perm = _call(a, sup, "start_child", sa.Tally, [], id="perm", restart="permanent")
        trans = _call(a, sup, "start_child", sa.Tally, [], id="trans", restart="transient")
        temp = _call(a, sup, "start_child", sa.Tally, [], id="temp", restart="temporary")
        _call(a, trans, "quit", "normal")  # a transient child that ends normally stays ended
        _call(a, temp, "quit", "crashed")  # a temporary one is never restarted
        assert wait_for(lambda: [k["id"] for k in _call(a, sup, "which_children")] == ["perm"], timeout=10)
        down: list = []
        a.run(_watch(a, sup, down), timeout=10)
        for i in range(3):  # the third restart within the period is one too many
            _call(a, perm, "quit", f"crash {i}", timeout=30)
            if i < 2:
                assert wait_for(lambda: _call(a, sup, "which_children")[0]["restarts"] == i + 1, timeout=10)
        assert wait_for(lambda: down, timeout=10)
        assert down[0].startswith("escalated: more than 2 restarts")
        with pytest.raises(lattica.errors.LatticaError):
            _call(a, sup, "children", timeout=10)


async def _watch(node, ref, out):
    node._host.runtime.monitors.watch(ref, lambda r, why: out.append(why))


def test_nested_supervisors_and_children_die_with_their_supervisor():
    with _mesh(2) as (a, b):
        top = _sup(a, strategy="one_for_one", max_restarts=3, within=60)
        inner_spec = {"cls": sa.Tally, "args": [], "id": "leaf"}
        inner = _call(
            a,
            top,
            "start_child",
            lattica.Supervisor,
            [],
            {"strategy": "one_for_all", "children": [inner_spec]},
            id="inner",
        )
        leaves = _call(a, inner, "children")
        assert len(leaves) == 1 and leaves[0].name.endswith("/inner/leaf")
        _call(a, leaves[0], "add", 3)
        first_leaf_node = _call(a, leaves[0], "where")
        # kill the inner supervisor: its leaf goes down with it; the top restarts the inner one,
        # which starts a fresh leaf under the same stable name
        inner_now = _call(a, top, "which_children")[0]["node"]
        host = a if inner_now == str(a.peer_id) else b
        host.run(lattica.akill(lattica.ActorRef(host.peer_id, inner.name, inner.methods)), timeout=10)
        assert wait_for(lambda: _call(a, top, "which_children")[0]["restarts"] == 1, timeout=10)
        assert wait_for(lambda: _try_get(a, leaves[0]) == 0, timeout=20)  # the leaf is new (state 0)
        assert first_leaf_node  # (where it ran first; it may run on either node now)


def test_a_late_down_notice_of_a_supervisor_s_old_incarnation_spares_its_successor_s_child():
    # The race behind the nested test's occasional failure, made deterministic on one node: the
    # notice that a supervisor went down is handled in a task, after its next incarnation (same
    # name) has started a child under the old child's name. A binding is to an incarnation
    # (an Erlang link is to a pid): the notice must not stop the new child.
    with lattica.Node([TCP], allow=ALLOW) as a:
        rt = a._host.runtime
        spawner = rt.actors["spawner"].instance
        tally = "sample_actors.Tally"

        async def go():
            old_sup = await spawner.spawn(tally, [], None, "sup", {})
            await spawner.spawn(tally, [], None, "sup/leaf", {"supervisor": old_sup})
            old_leaf = rt.actors["sup/leaf"]
            await rt.actors["sup"].stop("killed")  # the leaf's binding is told in a task, not yet run
            new_sup = rt.create(sa.Tally.cls, [], None, "sup")  # the next incarnation, at once
            assert old_leaf.state == "running"
            # the new incarnation starts its child, replacing the orphan; while it constructs,
            # the old incarnation's notice is handled
            new_leaf = await spawner.spawn(tally, [], None, "sup/leaf", {"supervisor": new_sup.ref})
            await asyncio.sleep(0.2)
            return old_leaf.state, rt.actors.get("sup/leaf"), new_leaf

        old_state, holder, new_leaf = a.run(go(), timeout=10)
        assert old_state == "stopped"
        assert holder is not None and holder.state == "running" and holder.ref == new_leaf
        # and the new child is still bound to the new incarnation: it goes down with it
        a.run(rt.actors["sup"].stop("killed"), timeout=10)
        assert wait_for(lambda: "sup/leaf" not in rt.actors, timeout=10)


def test_a_supervisor_s_late_stop_of_its_children_spares_those_of_its_next_incarnation():
    # A supervisor stops its children when it stops; when that comes late (here: a slow
    # on_stop), its next incarnation has already started theirs under the same names. Like
    # Erlang's supervisor, which shuts its children down by pid, it stops only its own: the
    # fresh children (one on its node, one on the other) are left alone.
    with _mesh(2) as (a, b):
        top = _sup(a, strategy="one_for_one", max_restarts=3, within=60)
        kids = [
            {"cls": sa.Tally, "id": "far", "node": str(b.peer_id)},
            {"cls": sa.Tally, "id": "near", "node": str(a.peer_id)},
        ]
        inner = a.run(
            _remote(
                top.start_child,
                sa.SlowSupervisor,
                [],
                {"children": kids, "stop_delay": 1.0},
                id="inner",
                node=a.peer_id,
            ),
            timeout=30,
        )
        leaves = _call(a, inner, "children")
        a.run(lattica.akill(lattica.ActorRef(a.peer_id, inner.name, inner.methods)), timeout=10)
        assert wait_for(lambda: _call(a, top, "which_children")[0]["restarts"] == 1, timeout=10)
        assert wait_for(lambda: all(_try_get(a, leaf) == 0 for leaf in leaves), timeout=10)
        time.sleep(1.5)  # past the old incarnation's stop of its children
        assert _call(a, inner, "history") == []  # no child of the new one went down
        assert [k["restarts"] for k in _call(a, inner, "which_children")] == [0, 0]
        assert _call(a, top, "which_children")[0]["restarts"] == 1


async def _remote(method, *args, **kwargs):
    return await method.remote(*args, **kwargs)


def _try_get(node, ref):
    try:
        return _call(node, ref, "get", timeout=10)
    except lattica.errors.LatticaError:
        return None


def test_a_sigkilled_node_s_children_come_back_elsewhere_with_their_checkpoints(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p))
    with (
        lattica.Node([TCP], allow=ALLOW, resources={"cpu": 1}) as me,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p1,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p2,
    ):
        for p in (p1, p2):
            me.connect(p.addr("tcp"))
        lattica.dht.bootstrap(node=me).result(10)
        assert wait_for(lambda: len(me.nodes()) == 3 and all("cpu" in r for r in me.nodes()), timeout=15)
        sup = _sup(me, strategy="one_for_one", max_restarts=10, within=60)
        # resources={"cpu": 1} and 1 cpu here: with checkpoints kept on this node, the children
        # go to the two other processes
        refs = [
            _call(me, sup, "start_child", sa.Tally, [], id=f"t{i}", resources={"cpu": 0.5}, checkpoint_every=0.1)
            for i in range(4)
        ]
        homes = {_call(me, r, "where") for r in refs}
        assert homes == {str(p1.peer_id), str(p2.peer_id)}
        for i, r in enumerate(refs):
            _call(me, r, "add", 10 + i)
        assert wait_for(lambda: all(k["checkpointed"] for k in _call(me, sup, "which_children")), timeout=10)
        time.sleep(0.3)  # a checkpoint after the adds
        victims = [r for r in refs if _call(me, r, "where") == str(p1.peer_id)]
        t0 = time.monotonic()
        os.kill(p1.proc.pid, signal.SIGKILL)
        # a call through a stable ref made right after the kill: it may already be on its way to
        # the dead process (ActorRestarted: it is safe to retry, as get is); the retry is answered
        # by the new incarnation
        restarted = 0
        while True:
            try:
                value = _call(me, victims[0], "get", timeout=30)
                break
            except lattica.errors.ActorRestarted:
                restarted += 1
                assert restarted == 1
        answered = time.monotonic() - t0
        assert value == 10 + refs.index(victims[0])
        for r in victims:
            assert _call(me, r, "where") == str(p2.peer_id)  # restarted elsewhere ...
            assert _call(me, r, "was_restored") is True  # ... from its checkpoint
        kids = _call(me, sup, "which_children")
        assert all(k["node"] == str(p2.peer_id) for k in kids)
        with capsys.disabled():
            print(f"\nsupervisor: SIGKILLed node's children answering elsewhere after {answered:.2f} s")


def test_when_a_supervisor_s_node_dies_its_successor_restores_the_children_from_copies(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p))
    with (
        lattica.Node([TCP], allow=ALLOW, resources={"cpu": 1}) as me,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p1,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p2,
    ):
        for p in (p1, p2):
            me.connect(p.addr("tcp"))
        lattica.dht.bootstrap(node=me).result(10)
        assert wait_for(lambda: len(me.nodes()) == 3 and all("cpu" in r for r in me.nodes()), timeout=15)
        top = _sup(me, strategy="one_for_one", max_restarts=5, within=60)
        # the inner supervisor (holding the checkpoints) on p1, its child on p2: the copy goes to
        # the third node, this one
        leaf = {"cls": sa.Tally, "args": [], "id": "leaf", "node": p2.peer_id, "checkpoint_every": 0.1}
        spec = {"strategy": "one_for_one", "children": [leaf]}
        inner = me.run(_remote(top.start_child, lattica.Supervisor, [], spec, id="inner", node=p1.peer_id), timeout=30)
        (child,) = _call(me, inner, "children")
        assert _call(me, child, "where") == p2.peer_id
        _call(me, child, "add", 31)
        store = me._host.runtime.actors["checkpoints"].instance
        assert wait_for(lambda: store._copies.get(child.name) is not None, timeout=10)
        time.sleep(0.3)  # a copy taken after the add
        os.kill(p1.proc.pid, signal.SIGKILL)
        # the inner supervisor died with p1, its child with it (bound); the top restarts the
        # inner one elsewhere, which finds the copy and restores the child from it
        assert wait_for(lambda: _call(me, top, "which_children")[0]["restarts"] == 1, timeout=15)
        # (the old child may answer until its node hears the inner supervisor died)
        assert wait_for(lambda: _try(lambda: _call(me, child, "was_restored", timeout=10)) is True, timeout=20)
        assert _call(me, child, "get") == 31
        inner_history = _call(me, lattica.ActorRef(me.peer_id, inner.name, inner.methods, stable=True), "history")
        assert [h["event"] for h in inner_history][:1] == ["recovered"]


def test_a_frozen_node_s_children_come_back_elsewhere_and_its_old_ones_stop_when_it_thaws(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p))
    with (
        lattica.Node([TCP], allow=ALLOW, resources={"cpu": 1}) as me,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p1,
        ServerProcess([TCP], "--allow", "sample_actors.*") as p2,
    ):
        for p in (p1, p2):
            me.connect(p.addr("tcp"))
        lattica.dht.bootstrap(node=me).result(10)
        assert wait_for(lambda: len(me.nodes()) == 3 and all("cpu" in r for r in me.nodes()), timeout=15)
        sup = _sup(me, strategy="one_for_one", max_restarts=10, within=60)
        refs = [
            _call(me, sup, "start_child", sa.Tally, [], id=f"f{i}", resources={"cpu": 0.5}, checkpoint_every=0.1)
            for i in range(4)
        ]
        assert {_call(me, r, "where") for r in refs} == {str(p1.peer_id), str(p2.peer_id)}
        frozen, other = [r for r in refs if _call(me, r, "where") == str(p1.peer_id)]
        _call(me, frozen, "add", 42)
        _call(me, other, "add", 7)
        time.sleep(0.4)  # checkpointed
        t0 = time.monotonic()
        os.kill(p1.proc.pid, signal.SIGSTOP)
        try:
            value = None
            while value is None:
                try:
                    value = _call(me, frozen, "get", timeout=30)
                except lattica.errors.ActorRestarted:
                    pass  # the first try was waiting on the frozen process
                except lattica.errors.CallTimeout:
                    pass
            answered = time.monotonic() - t0
            assert value == 42 and _call(me, frozen, "where") == str(p2.peer_id)
            # made after the verdict: a stable ref does not wait on the frozen process (its
            # connection is still open) but follows its actor; a plain ref fails at once
            t1 = time.monotonic()
            assert _call(me, other, "get", timeout=30) == 7
            assert time.monotonic() - t1 < 10
            plain = lattica.ActorRef(lattica.PeerId.from_string(p1.peer_id), other.name, other.methods)
            with pytest.raises(lattica.errors.PeerUnreachable, match="declared dead"):
                _call(me, plain, "get", timeout=30)
        finally:
            os.kill(p1.proc.pid, signal.SIGCONT)
        # thawed, p1 hears it was declared dead, rejoins, and stops its now duplicate child
        p1_id = lattica.PeerId.from_string(p1.peer_id)
        # (calls to p1 fail while it is held dead: until it has rejoined under a new incarnation)
        assert wait_for(
            lambda: (
                (names := _try(lambda: me.run(_names(me, p1_id), timeout=10))) is not None
                and not [n for n in names if "/f" in n]
            ),
            timeout=15,
        )
        with capsys.disabled():
            print(f"\nsupervisor: SIGSTOPped node's children answering elsewhere after {answered:.2f} s")


def _try(fn):
    try:
        return fn()
    except (
        lattica.errors.PeerUnreachable,
        lattica.errors.ActorDied,
        lattica.errors.ActorNotFound,
        lattica.errors.CallTimeout,
    ):
        return None


async def _names(node, peer):
    from lattica._runtime import spawner_ref

    return await node._host.runtime.call(spawner_ref(peer), "names", (), {}, timeout=5)


def test_start_child_calls_fired_together_get_their_own_ids_and_children_are_usable_refs():
    with _mesh(2) as (a, b):
        sup = _sup(a, strategy="one_for_one", max_restarts=5, within=60)

        async def fire():
            starts = [sup.start_child.remote(sa.Tally, [f"t{i}"]) for i in range(6)]
            during = sup.children.remote()  # asked while they start
            return await asyncio.gather(*starts), await during

        refs, during = a.run(fire(), timeout=30)
        ids = [k["id"] for k in _call(a, sup, "which_children")]
        assert len(set(ids)) == 6 and len({r.name for r in refs}) == 6
        assert all("add" in k.methods for k in during)
        kids = _call(a, sup, "children")
        assert all("add" in k.methods for k in kids) and _call(a, kids[0], "add", 2) == 2
