"""The trust model between real nodes on loopback (docs/security.md): members of a mesh (same
mesh key, an invitation certificate, a listed PeerId, or an open mesh) may use everything; a
stranger (any other authenticated PeerId) gets PermissionDenied for user actors, spawning, killing,
checkpoints and membership, learns nothing of which actors exist, and still gets what the open
network needs (ping, the DHT, relay reservations) and the actors or methods opened to it. A fresh
process that names its mesh through LATTICA_MESH joins it in one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import lattica
import sample_actors as sa
from helpers import call_as, spawn_local, wait_for
from lattica._runtime import spawner_ref
from lattica.actors.membership import membership_ref
from lattica.actors.supervisor import checkpoints_ref
from lattica.errors import PermissionDenied
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]
HERE = os.path.dirname(os.path.abspath(__file__))


def test_each_side_knows_what_the_other_is(mesh):
    host, member, stranger = mesh
    seen = {str(p.peer_id): (p.circle, p.circle_reason) for p in host.peers()}
    assert seen[str(member.peer_id)][0] == "member"
    circle, why = seen[str(stranger.peer_id)]
    assert circle == "stranger" and "not ours" in why


def test_a_stranger_may_not_call_spawn_kill_or_look_at_actors(mesh):
    host, member, stranger = mesh
    counter = spawn_local(host, sa.Counter, 5, name="counter")
    assert call_as(member, counter, "incr") == 6
    for ref, method, args in [
        (counter, "incr", ()),
        (spawner_ref(host.peer_id), "spawn", ("sample_actors.Counter", [1], {})),
        (spawner_ref(host.peer_id), "kill", ("counter",)),
        (spawner_ref(host.peer_id), "names", ()),
        (checkpoints_ref(host.peer_id), "fetch", ("some-supervisor",)),
        (membership_ref(host.peer_id), "view", ()),
    ]:
        with pytest.raises(PermissionDenied, match="not a member of this node's mesh"):
            call_as(stranger, ref, method, *args)
    assert call_as(member, counter, "get") == 6  # nothing changed
    # an actor that does not exist gets the very same answer: strangers learn nothing
    missing = lattica.ActorRef(host.peer_id, "no-such-actor", {"get": "async"})
    with pytest.raises(PermissionDenied):
        call_as(stranger, missing, "get")
    for name in ("counter", "no-such-actor"):  # told why, and nothing of whether the name is taken
        with pytest.raises(
            PermissionDenied,
            match="is not a member of .* mesh .*it presented no mesh certificate|its certificate is for",
        ):
            call_as(stranger, spawner_ref(host.peer_id), "lookup", name)
    assert call_as(member, spawner_ref(host.peer_id), "lookup", "counter").name == "counter"
    refused = host.run(_refusals(host), timeout=5)
    assert any(r["peer"] == str(stranger.peer_id) and r["what"] == "counter.incr" for r in refused)


async def _register_name(node, ref):
    from lattica import codec
    from lattica.actors.dht import name_key

    dht = node._host.services.dht
    await dht.bootstrap()
    return await dht.put(
        name_key(ref.name),
        codec.encode_bytes([ref, node._host.trust.presented]),
        subkey=node.peer_id,
        ttl=60,
        republish=False,
    )


async def _refusals(node):
    return list(node._host.refusals)


def test_strangers_are_not_members_of_the_membership_view(mesh):
    host, member, stranger = mesh
    ids = lambda: {r["peer_id"] for r in host.nodes()}  # noqa: E731
    assert wait_for(lambda: str(member.peer_id) in ids(), timeout=5)
    assert str(stranger.peer_id) not in ids()


def test_a_stranger_gets_the_open_network_and_what_is_opened_to_it(mesh):
    host, member, stranger = mesh
    assert stranger.ping(host.peer_id) > 0
    shop = spawn_local(host, sa.Shop, name="shop")
    echo = spawn_local(host, sa.Echo, name="echo")
    assert call_as(stranger, shop, "browse") == {"apple": 3}
    assert call_as(stranger, shop, "who") == str(stranger.peer_id)  # the method can tell callers apart
    with pytest.raises(PermissionDenied):
        call_as(stranger, shop, "restock", "apple", 100)
    assert call_as(member, shop, "restock", "apple", 1) == 4
    assert call_as(stranger, echo, "echo", [1, "x"]) == [1, "x"]
    # a public method with its own ACL (lattica.require_caller)
    assert call_as(member, shop, "order", "pear") == f"pear for {member.peer_id}"
    with pytest.raises(PermissionDenied, match="may not call this") as refused:
        call_as(stranger, shop, "order", "pear")
    assert not getattr(refused.value, "remote_traceback", "")  # (a stranger is not shown our code)
    with pytest.raises(TypeError) as failed:
        call_as(member, shop, "restock", "apple", "many")
    assert "sample_actors.py" in failed.value.remote_traceback  # (a member is: its own mesh's)
    assert call_as(stranger, shop, "order", "pear", str(stranger.peer_id)) == f"pear for {stranger.peer_id}"
    assert call_as(stranger, spawner_ref(host.peer_id), "lookup", "shop").name == "shop"  # open: visible

    # the DHT is the open network's: a stranger stores and finds records through a mesh node
    async def put():
        dht = stranger._host.services.dht
        await dht.bootstrap()
        return await dht.put(b"open-record", b"v", ttl=60)

    async def get():
        return await host._host.services.dht.get(b"open-record")

    assert stranger.run(put(), timeout=20) >= 1
    got = host.run(get(), timeout=20)
    assert got and got[b""].value == b"v"


def test_an_invitation_a_listed_peer_and_an_open_mesh_admit(tmp_path):
    a = MeshKey.generate()
    guest_key = lattica.KeyPair.generate()
    invitation = a.issue(guest_key.peer_id).to_text()
    listed_key = lattica.KeyPair.generate()
    with lattica.Node([TCP], mesh=a, members=[listed_key.peer_id], allow=ALLOW) as host:
        counter = spawn_local(host, sa.Counter, 1, name="counter")
        with lattica.Node([TCP], keypair=guest_key, mesh=invitation) as guest:
            guest.connect(host.addrs[0])
            assert call_as(guest, counter, "incr") == 2
            # and the host is a member to the guest (the invitation names mesh A's key)
            assert [p.circle for p in guest.peers()] == ["member"]
        with lattica.Node([TCP], keypair=listed_key, mesh=MeshKey.generate()) as listed:
            listed.connect(host.addrs[0])
            assert call_as(listed, counter, "incr") == 3
    with (
        lattica.Node([TCP], mesh="open", allow=ALLOW) as open_host,
        lattica.Node([TCP], mesh=MeshKey.generate()) as anyone,
    ):
        anyone.connect(open_host.addrs[0])
        c = spawn_local(open_host, sa.Counter, 7, name="counter")
        assert call_as(anyone, c, "get") == 7


CHILD = r"""
import json, sys
import lattica
from lattica.errors import PermissionDenied
sys.path.insert(0, sys.argv[2])
lattica.init(bootstrap=[sys.argv[1]])
ref = lattica.ActorRef(lattica.PeerId.from_string(sys.argv[3]), "counter", {"incr": "sync"})
try:
    print(json.dumps({"ok": ref.incr.remote().result(10)}))
except PermissionDenied as e:
    print(json.dumps({"denied": str(e)}))
"""


def test_a_fresh_script_joins_the_mesh_named_in_its_environment():
    a = MeshKey.generate()
    with lattica.Node([TCP], mesh=a, allow=ALLOW) as host:
        spawn_local(host, sa.Counter, 0, name="counter")
        support = os.path.join(HERE, "..", "support")

        def run(mesh_env):
            env = dict(os.environ, LATTICA_MESH=mesh_env)
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(host.addrs[0]), support, str(host.peer_id)],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout.strip().splitlines()[-1])

        assert run(a.to_text()) == {"ok": 1}
        denied = run(MeshKey.generate().to_text())
        assert "not a member" in denied["denied"]


def test_a_stranger_cannot_take_over_a_name_and_sees_only_open_methods(mesh):
    """The DHT is open, so a stranger can store a registration of any name (even one that lives
    longer than ours): members follow registrations by members only."""
    host, member, stranger = mesh
    from lattica import codec
    from lattica.actors.dht import name_key

    real = spawn_local(host, sa.Counter, 1, name="vault")
    fake = spawn_local(stranger, sa.Echo, name="vault")

    async def register(node, ref, ttl):
        dht = node._host.services.dht
        await dht.bootstrap()
        value = codec.encode_bytes([ref, node._host.trust.presented])
        return await dht.put(name_key("vault"), value, subkey=node.peer_id, ttl=ttl, republish=False)

    assert host.run(register(host, real, 60), timeout=20) >= 1
    assert stranger.run(register(stranger, fake, 300), timeout=20) >= 1  # the fresher one

    async def resolve(node):
        await node._host.services.dht.bootstrap()
        return await node._host.services.dht.resolve_name("vault")

    assert member.run(resolve(member), timeout=20).peer_id == host.peer_id
    # the stranger's own lookup of a name only members hold says why it cannot follow them
    real_only = spawn_local(host, sa.Counter, 2, name="members-only")
    assert host.run(_register_name(host, real_only), timeout=20) >= 1
    with pytest.raises(PermissionDenied, match="registered only by nodes outside this node's mesh"):
        stranger.run(stranger._host.services.dht.resolve_name("members-only"), timeout=20)
    # a stranger's lookup gets an open actor's ref with its open methods only
    shop = spawn_local(host, sa.Shop, name="shop")
    seen = call_as(stranger, spawner_ref(host.peer_id), "lookup", "shop")
    assert set(seen.methods) == {"browse", "who", "order"} and set(shop.methods) == {
        "browse",
        "who",
        "order",
        "restock",
    }


def test_an_invitation_that_expires_while_connected_ends_the_membership():
    """The verdict holds until the admitting certificate expires: then the connection closes, and
    the peer, reconnecting, is judged afresh (a stranger now, saying why)."""
    a = MeshKey.generate()
    guest_key = lattica.KeyPair.generate()
    # long enough that two nodes start and connect inside it on a loaded CI machine (2 s was not)
    short = a.issue(guest_key.peer_id, ttl=6.0)
    with (
        lattica.Node([TCP], mesh=a, allow=ALLOW, membership=False) as host,
        lattica.Node([], keypair=guest_key, mesh=short, membership=False) as guest,
    ):
        guest.connect(host.addrs[0])
        # (the host judges the guest once its identify arrives: a moment after the dial returns)
        assert wait_for(lambda: [p.circle for p in host.peers()] == ["member"], timeout=5)
        assert wait_for(lambda: host.peers() == [], timeout=10)
        guest.connect(host.addrs[0])
        assert wait_for(
            lambda: [(p.circle, "expired" in p.circle_reason) for p in host.peers()] == [("stranger", True)]
        )
