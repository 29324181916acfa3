"""Checkpoint copies cannot be poisoned (issue 17 must-have 4), with real nodes on loopback: a
member that did not write a copy cannot overwrite it (its own copy of the name goes in a slot of
its own; a stamp of 1e308 is refused), read it or drop it while its writer lives, nor squat the
name ahead of its writer; a copy must be signed by the node that sends it, with a sane
stamp; and what the holder returns carries the writer's signature."""

from __future__ import annotations

import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica.actors.supervisor import checkpoints_ref, read_copies, sign_copy
from lattica.errors import CheckpointRejected
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def three():
    """``holder`` and ``writer`` hold the mesh key; ``member`` was invited."""
    key = MeshKey.generate()
    km = lattica.KeyPair.generate()
    with (
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=key) as holder,
        lattica.Node([], mesh=key) as writer,
        lattica.Node([], keypair=km, mesh=key.issue(km.peer_id)) as member,
    ):
        writer.connect(holder.addrs[0])
        member.connect(holder.addrs[0])
        assert wait_for(lambda: len(holder.peers()) == 2 and all(p.circle == "member" for p in holder.peers()))
        yield holder, writer, member


def _keep(node, holder, name, stamp, blob, signer=None):
    sig = sign_copy((signer or node)._host.keypair, name, stamp, blob)
    return call_as(node, checkpoints_ref(holder.peer_id), "keep", name, stamp, blob, sig, node._host.trust.presented)


def test_a_member_cannot_poison_read_or_drop_anothers_copy(three):
    holder, writer, member = three
    stamp = time.time()
    assert _keep(member, holder, "sup/w0", stamp - 1, b"squatted") is True  # ahead of the writer: its own slot
    assert _keep(writer, holder, "sup/w0", stamp, b"honest state") is True  # not blocked by it
    assert _keep(member, holder, "sup/w0", stamp + 1, b"poison") is True  # replaces only its own
    with pytest.raises(CheckpointRejected, match="ahead"):
        _keep(member, holder, "sup/w0", 1e308, b"poison")  # the stamp that used to win forever
    ref = checkpoints_ref(holder.peer_id)
    assert [c[1] for c in call_as(member, ref, "fetch", "sup/w0")] == [b"poison"]  # its own, never the writer's
    call_as(member, ref, "drop", "sup/w0")  # drops its own only
    with pytest.raises(CheckpointRejected, match="writers are alive"):
        call_as(member, ref, "fetch", "sup/w0")  # nothing of its own left: the writer's is not its to read
    with pytest.raises(CheckpointRejected, match="writers are alive"):
        call_as(member, ref, "drop", "sup/w0")
    (copy,) = read_copies(call_as(writer, ref, "fetch", "sup/w0"), "sup/w0")
    stamp_, blob, who, _ = copy
    assert blob == b"honest state" and who == writer.peer_id and stamp_ == stamp


def test_a_copy_signed_by_someone_else_is_refused(three):
    holder, writer, member = three
    with pytest.raises(CheckpointRejected, match="not signed"):
        _keep(member, holder, "sup/w1", time.time(), b"x", signer=writer)  # writer's key, member's connection


def test_a_member_ground_to_hold_a_name_first_neither_swallows_the_copies_nor_plants_its_own(monkeypatch):
    """Issue 46, finding 4. An invited member whose PeerId is ground to rank first for a child's
    name accepts the supervisor's copies and keeps none, and answers a fetch with a copy of its
    own (state it made up, signed by itself). The supervisor's node is killed; its successor
    restores the child from the copies the other holders kept, not from the member's (before:
    the copy went to the first holder only, and a plain member's copy was restored when no
    better one was found)."""
    import os
    import signal

    import sample_actors as sa
    from lattica import codec
    from lattica.actors.supervisor import ranked
    from lattica.mesh.process import ServerProcess
    from lattica.trust import default_mesh_path

    support = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (support, os.environ.get("PYTHONPATH")) if p))
    tcp = "/ip4/127.0.0.1/tcp/0"

    def call(node, ref, method, *args, timeout=30, **kwargs):
        async def go():
            return await getattr(ref, method).remote(*args, **kwargs)

        return node.run(go(), timeout=timeout)

    def attempt(fn):
        try:
            return fn()
        except lattica.errors.LatticaError:
            return None

    with (
        lattica.Node([tcp], allow=["sample_actors.*"], resources={"cpu": 1}) as me,
        ServerProcess([tcp], "--allow", "sample_actors.*") as p1,
        ServerProcess([tcp], "--allow", "sample_actors.*") as p2,
    ):
        for p in (p1, p2):
            me.connect(p.addr("tcp"))
        lattica.dht.bootstrap(node=me).result(10)
        assert wait_for(lambda: len(me.nodes()) == 3 and all("cpu" in r for r in me.nodes()), timeout=15)

        async def start_top():
            sup = lattica.Supervisor.remote(strategy="one_for_one", max_restarts=5, within=60)
            await sup.children.remote()
            return sup

        top = me.run(start_top(), timeout=30)
        leaf = {"cls": sa.Tally, "args": [], "id": "leaf", "node": p2.peer_id, "checkpoint_every": 0.1}
        spec = {"strategy": "one_for_one", "children": [leaf]}

        async def start_inner():
            return await top.start_child.remote(lattica.Supervisor, [], spec, id="inner", node=p1.peer_id)

        inner = me.run(start_inner(), timeout=30)
        (child,) = call(me, inner, "children")
        name = child.name
        while True:  # grind: the member ranks before this node among the holders the copy may go to
            km = lattica.KeyPair.generate()
            if ranked(name, [str(me.peer_id), str(km.peer_id)])[0] == str(km.peer_id):
                break
        mesh = MeshKey.load_or_create(default_mesh_path())
        with lattica.Node([tcp], keypair=km, mesh=mesh.issue(km.peer_id)) as member:
            kept = []
            forged = codec.encode_bytes({"total": 666})

            async def swallow(name_, stamp, blob, signature, certs):
                kept.append(name_)
                return True

            async def plant(name_):
                stamp = time.time() + 200
                return [
                    [
                        stamp,
                        forged,
                        member.peer_id.to_bytes(),
                        sign_copy(member._host.keypair, name_, stamp, forged),
                        member._host.trust.presented,
                    ]
                ]

            bound = member._host.runtime.actors["checkpoints"].bound
            bound["keep"], bound["fetch"] = swallow, plant
            member.connect(p1.addr("tcp"))
            member.connect(me.addrs[0])
            assert wait_for(lambda: name in kept, timeout=20), "the ground member never became a holder"
            call(me, child, "add", 31)
            store = me._host.runtime.actors["checkpoints"].instance

            def held_here():
                copy = store._copies.get(name, {}).get(lattica.PeerId.from_string(str(p1.peer_id)))
                return codec.decode(copy.blob) if copy is not None else None

            assert wait_for(lambda: held_here() == {"total": 31}, timeout=10)
            os.kill(p1.proc.pid, signal.SIGKILL)
            assert wait_for(lambda: call(me, top, "which_children")[0]["restarts"] == 1, timeout=20)
            assert wait_for(lambda: attempt(lambda: call(me, child, "was_restored", timeout=10)) is True, timeout=25)
            assert call(me, child, "get") == 31
