"""lattica.link / lattica.unlink across nodes: a linked pair goes down together; unlinked, they
do not; an actor may be linked to several others and to its supervisor at once."""

from __future__ import annotations

import contextlib

import lattica
import sample_actors as sa
from helpers import wait_for

TCP = "/ip4/127.0.0.1/tcp/0"


@contextlib.contextmanager
def _pair():
    with lattica.Node([TCP], allow=["sample_actors.*"]) as a, lattica.Node([TCP], allow=["sample_actors.*"]) as b:
        b.connect(a.addrs[0])
        yield a, b


def _spawn(node, target, cls=sa.Linker):
    async def go():
        ref = cls.options(node=target.peer_id).remote()
        await ref._spawn
        return ref

    return node.run(go(), timeout=30)


def _call(node, ref, method, *args):
    async def go():
        return await getattr(ref, method).remote(*args)

    return node.run(go(), timeout=30)


def _bound(node, name):
    return node._host.runtime.actors["spawner"].instance.bindings.of(name)


def _alive(node, ref):
    return ref.name in node._host.runtime.actors


def _key(ref):
    return (str(ref.peer_id), ref.name)


def test_linked_actors_on_two_nodes_go_down_together_both_ways():
    with _pair() as (a, b):
        for victim_side in ("b", "a"):
            x, y = _spawn(a, a), _spawn(a, b)
            _call(a, x, "link_to", y)
            assert wait_for(lambda: _bound(a, x.name) == {_key(y)} and _bound(b, y.name) == {_key(x)}, timeout=10)
            victim, other, other_node = (y, x, a) if victim_side == "b" else (x, y, b)
            a.run(lattica.akill(victim), timeout=10)
            assert wait_for(lambda: not _alive(other_node, other), timeout=10)


def test_unlinked_actors_no_longer_go_down_together():
    with _pair() as (a, b):
        x, y = _spawn(a, a), _spawn(a, b)
        _call(a, x, "link_to", y)
        assert wait_for(lambda: _bound(b, y.name) == {_key(x)}, timeout=10)
        _call(a, x, "unlink_from", y)
        assert wait_for(lambda: not _bound(a, x.name) and not _bound(b, y.name), timeout=10)
        a.run(lattica.akill(y), timeout=10)
        assert wait_for(lambda: not _alive(b, y), timeout=10)
        assert _call(a, x, "ping") == "pong"  # still here


def test_a_supervised_child_keeps_its_supervisor_when_it_links_to_others():
    with _pair() as (a, b):

        async def sup():
            s = lattica.Supervisor.remote(strategy="one_for_one", max_restarts=5, within=60)
            return s, await s.start_child.remote(sa.Linker, id="kid", node=b.peer_id)

        s, kid = a.run(sup(), timeout=30)
        friends = [_spawn(a, a), _spawn(a, b)]
        for f in friends:
            _call(a, kid, "link_to", f)
        assert wait_for(lambda: len(_bound(b, kid.name)) == 3, timeout=10)  # its supervisor and two links
        a.run(lattica.akill(friends[0]), timeout=10)  # one link goes down: the child with it ...
        assert wait_for(lambda: _call(a, s, "which_children")[0]["restarts"] == 1, timeout=10)  # ... and is restarted
        assert _call(a, kid, "ping") == "pong"
        assert wait_for(
            lambda: _bound(b, kid.name) == {_key(s)}, timeout=10
        )  # the new incarnation: its supervisor only
