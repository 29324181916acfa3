"""Ownership of actors (issue 17 must-have 2), with real nodes on loopback: within one mesh, only
whoever controls an actor (the node that created it, its supervisor's node, the node it lives on,
or an administrator of the mesh: a node holding the mesh key) may kill, link, unlink or replace
it, or add and remove a supervisor's children; any member may still call it and monitor it. A
member (invited, not an administrator) owns at most a bounded number of actors on a node."""

from __future__ import annotations

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._runtime import ActorRef, spawner_ref
from lattica.actors import spawner as spawner_mod
from lattica.errors import ActorNotFound, LatticaError, PermissionDenied, SpawnError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
COUNTER = "sample_actors.Counter"
SUPERVISOR = "lattica.supervisor.Supervisor"


@pytest.fixture
def mesh_of_four():
    """``host`` and ``admin`` hold the mesh key; ``alice`` and ``bob`` were invited (members)."""
    key = MeshKey.generate()
    ka, kb = lattica.KeyPair.generate(), lattica.KeyPair.generate()
    with (
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"]) as host,
        lattica.Node([], mesh=key) as admin,
        lattica.Node([], keypair=ka, mesh=key.issue(ka.peer_id)) as alice,
        lattica.Node([], keypair=kb, mesh=key.issue(kb.peer_id)) as bob,
    ):
        for n in (admin, alice, bob):
            n.connect(host.addrs[0])
        assert wait_for(lambda: len([p for p in host.peers() if p.circle == "member"]) == 3)
        yield host, admin, alice, bob


def _spawn(node, host, cls=COUNTER, args=(0,), name=None, options=None):
    return call_as(node, spawner_ref(host.peer_id), "spawn", cls, list(args), {}, name, options or {})


def _admins(host):
    return {str(p.peer_id) for p in host.peers() if p.admin}


def test_administrators_are_the_key_holders(mesh_of_four):
    host, admin, alice, bob = mesh_of_four
    assert _admins(host) == {str(admin.peer_id)}


def test_only_whoever_controls_an_actor_may_kill_it(mesh_of_four):
    host, admin, alice, bob = mesh_of_four
    ref = _spawn(alice, host, name="alices")
    assert call_as(bob, ref, "incr") == 1  # a member may call it...
    with pytest.raises(PermissionDenied, match="may not kill 'alices'"):
        call_as(bob, spawner_ref(host.peer_id), "kill", "alices")  # ...not kill it
    assert call_as(alice, ref, "get") == 1  # still there
    call_as(alice, spawner_ref(host.peer_id), "kill", "alices")  # its creator may
    with pytest.raises(ActorNotFound):
        call_as(alice, ref, "get")
    other = _spawn(alice, host, name="alices-2")
    call_as(admin, spawner_ref(host.peer_id), "kill", "alices-2")  # so may an administrator
    with pytest.raises(ActorNotFound):
        call_as(alice, other, "get")


def test_a_member_may_not_link_or_unlink_anothers_actor(mesh_of_four):
    host, admin, alice, bob = mesh_of_four
    ref = _spawn(alice, host, name="target")
    bobs = _spawn(bob, host, name="bobs")
    for method in ("link", "unlink"):
        with pytest.raises(PermissionDenied, match=f"may not {method} 'target'"):
            call_as(bob, spawner_ref(host.peer_id), method, "target", bobs)
    call_as(bob, spawner_ref(host.peer_id), "link", "bobs", ref)  # its own actor to anything: fine
    call_as(alice, spawner_ref(host.peer_id), "kill", "target")
    assert wait_for(lambda: "bobs" not in host._host.runtime.actors)  # the link held


def test_a_forged_replacement_naming_the_supervisor_is_refused(mesh_of_four):
    host, admin, alice, bob = mesh_of_four
    sup = _spawn(alice, host, cls=SUPERVISOR, args=(), name="sup")
    child = call_as(alice, sup, "start_child", COUNTER, [7], None, timeout=10, kwargs={"node": str(host.peer_id)})
    child_name = host._host.runtime.actors["spawner"].instance._supervisor
    name = next(n for n, s in child_name.items() if s == "sup")
    forged = ActorRef(bob.peer_id, "sup", {})  # "the supervisor's next incarnation, on bob"
    with pytest.raises(SpawnError, match="already exists"):
        _spawn(bob, host, args=(666,), name=name, options={"supervisor": forged})
    assert call_as(alice, child, "get") == 7  # the child is untouched


def test_only_whoever_controls_a_supervisor_may_change_its_children(mesh_of_four):
    host, admin, alice, bob = mesh_of_four
    sup = _spawn(alice, host, cls=SUPERVISOR, args=(), name="sup")
    call_as(alice, sup, "start_child", COUNTER, [1], None, timeout=10, kwargs={"node": str(host.peer_id)})
    kids = call_as(bob, sup, "which_children")  # reading is for every member
    with pytest.raises(PermissionDenied):
        call_as(bob, sup, "terminate_child", kids[0]["id"])
    with pytest.raises(PermissionDenied):
        call_as(bob, sup, "start_child", COUNTER, [2], None, kwargs={"node": str(host.peer_id)})
    call_as(
        admin, sup, "start_child", COUNTER, [3], None, timeout=10, kwargs={"node": str(host.peer_id)}
    )  # an administrator may
    assert len(call_as(alice, sup, "which_children")) == 2


def test_a_member_owns_a_bounded_number_of_actors_per_node(mesh_of_four, monkeypatch):
    host, admin, alice, bob = mesh_of_four
    monkeypatch.setattr(spawner_mod, "MAX_ACTORS_PER_MEMBER", 3)
    for i in range(3):
        _spawn(alice, host, name=f"a{i}")
    with pytest.raises(SpawnError, match="already owns 3 actors"):
        _spawn(alice, host, name="a3")
    _spawn(bob, host, name="b0")  # per member
    for i in range(5):
        _spawn(admin, host, name=f"admin{i}")  # administrators are not counted
    call_as(alice, spawner_ref(host.peer_id), "kill", "a0")
    _spawn(alice, host, name="a3")  # a stopped actor frees its slot


def test_a_members_supervisor_cannot_spawn_past_the_members_quota(mesh_of_four, monkeypatch):
    """Children a member's supervisor starts are the member's, and count against its quota (the
    supervisor's node spawns them, which used to leave them unowned and uncounted)."""
    host, admin, alice, bob = mesh_of_four
    monkeypatch.setattr(spawner_mod, "MAX_ACTORS_PER_MEMBER", 3)
    sup = _spawn(alice, host, cls=SUPERVISOR, args=(), name="sup")  # alice's first
    kids = [
        call_as(alice, sup, "start_child", COUNTER, [i], None, timeout=10, kwargs={"node": str(host.peer_id)})
        for i in range(2)
    ]
    with pytest.raises(LatticaError, match="already owns 3 actors"):
        call_as(alice, sup, "start_child", COUNTER, [9], None, timeout=10, kwargs={"node": str(host.peer_id)})
    spawner = host._host.runtime.actors["spawner"].instance
    assert {spawner._owner.get(k.name) for k in kids} == {alice.peer_id}  # the member owns them
    with pytest.raises(PermissionDenied):
        call_as(bob, spawner_ref(host.peer_id), "kill", kids[0].name)


def test_a_member_cannot_take_every_monitor_slot_of_anothers_actor(mesh_of_four):
    """A member may monitor any actor, but holds at most MAX_PER_WATCHER of its monitors: it can
    no longer fill the 4,096 slots so that the owner's next monitor fires "down" (a false down
    stops links and restarts supervised children). Its monitors go when its node goes."""
    from lattica._monitors import MAX_PER_WATCHER

    host, admin, alice, bob = mesh_of_four
    ref = _spawn(alice, host, name="watched")
    for i in range(MAX_PER_WATCHER):
        call_as(bob, spawner_ref(host.peer_id), "monitor", "watched", i)
    with pytest.raises(LatticaError, match=f"already has {MAX_PER_WATCHER} monitors"):
        call_as(bob, spawner_ref(host.peer_id), "monitor", "watched", 10_000)
    fired = []
    rt = alice._host.runtime

    async def watch():
        return rt.monitors.watch(ref, lambda r, why: fired.append(why))

    alice.run(watch())  # the owner's monitor is set...
    assert wait_for(lambda: any(w == alice.peer_id for w, _ in host._host.runtime.monitors.watchers["watched"]))
    assert call_as(alice, ref, "incr") == 1 and not fired  # ...and nothing fired
    monitors = host._host.runtime.monitors
    assert sum(1 for w, _ in monitors.watchers["watched"] if w == bob.peer_id) == MAX_PER_WATCHER
    monitors.node_down(str(bob.peer_id), "left")
    assert not any(w == bob.peer_id for w, _ in monitors.watchers["watched"]), "a gone node's monitors go"


def test_a_member_cannot_reserve_a_whole_node():
    """One spawn asking for every CPU and GPU a node offers no longer books it: a member (not an
    administrator) holds at most spawner.MEMBER_SHARE of each resource there; the rest stays for
    the others, and an administrator is not limited."""
    key = MeshKey.generate()
    ka, kb = lattica.KeyPair.generate(), lattica.KeyPair.generate()
    with (
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"], resources={"cpu": 8, "gpus": 2}) as host,
        lattica.Node([], mesh=key) as admin,
        lattica.Node([], keypair=ka, mesh=key.issue(ka.peer_id)) as mallory,
        lattica.Node([], keypair=kb, mesh=key.issue(kb.peer_id)) as alice,
    ):
        for n in (admin, mallory, alice):
            n.connect(host.addrs[0])
        assert wait_for(lambda: len([p for p in host.peers() if p.circle == "member"]) == 3)
        with pytest.raises(LatticaError, match="may hold at most 50%"):
            _spawn(mallory, host, name="hog", options={"reserve": {"cpu": 8, "gpus": 2}})
        _spawn(mallory, host, name="half", options={"reserve": {"cpu": 4, "gpus": 1}})
        with pytest.raises(LatticaError, match="may hold at most 50%"):
            _spawn(mallory, host, name="more", options={"reserve": {"cpu": 1}})
        _spawn(alice, host, name="work", options={"reserve": {"cpu": 2}})  # room left for others
        _spawn(admin, host, name="ops", options={"reserve": {"cpu": 2, "gpus": 1}})  # an administrator: no share


def test_a_members_resource_lure_does_not_win_an_administrators_placements():
    """Issue 46, finding 6: an invited member that claims a huge idle node (its own membership
    row says so, and placement believes rows) won 5 of 6 of an administrator's spawns, with
    their arguments. An administrator's placement now ranks administrators' nodes first (whose
    they are is read from the certificates sealed into their rows, not from what a row says):
    the member's claim decides only what no administrator's node fits."""
    import sample_actors as sa

    key = MeshKey.generate()
    km = lattica.KeyPair.generate()
    with (
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"], resources={"cpu": 2}) as admin,
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"], resources={"cpu": 2}) as other,
        lattica.Node(
            [TCP],
            keypair=km,
            mesh=key.issue(km.peer_id),
            allow=["sample_actors.*"],
            resources={"cpu": 1024, "gpus": 64},
        ) as mallory,
    ):
        other.connect(admin.addrs[0])
        mallory.connect(admin.addrs[0])
        mallory.connect(other.addrs[0])
        assert wait_for(lambda: len(admin.nodes()) == 3 and all("cpu" in r for r in admin.nodes()), timeout=10)
        rows = {r["peer_id"]: r for r in admin.nodes()}
        assert rows[str(admin.peer_id)]["admin"] and rows[str(other.peer_id)]["admin"]
        assert wait_for(lambda: {r["peer_id"]: r["admin"] for r in admin.nodes()}[str(mallory.peer_id)] is False)

        async def place(n, **options):
            refs = [sa.Counter.options(**options).remote(i) for i in range(n)]
            return refs, [await r.get.remote() for r in refs]

        refs, values = admin.run(place(4, resources={"cpu": 1}), timeout=30)
        assert values == list(range(4))
        assert mallory.peer_id not in {r.peer_id for r in refs}  # (it claimed 1,024 idle CPUs)
        refs, _ = admin.run(place(1, resources={"gpus": 1}), timeout=30)  # what no administrator's node has
        assert refs[0].peer_id == mallory.peer_id
        # the member's own spawns are placed as before (its claims are its own business)
        refs, _ = mallory.run(place(2, resources={"cpu": 1}), timeout=30)
        assert {r.peer_id for r in refs} == {mallory.peer_id}
