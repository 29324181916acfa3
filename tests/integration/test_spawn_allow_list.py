"""What a peer may spawn: the allow-list admits @lattica.actor classes only (no walking to
subprocess.Popen through a permitted module), an undecorated class is refused, on_stop is no
remote method."""

import time

import pytest

import call_actors as ra
import lattica
from call_fixtures import (
    TCP,
    spawn_via_spawner,
    spawner_names,
)
from lattica._runtime import spawner_ref
from lattica.errors import (
    MethodNotFound,
    SpawnError,
)

pytestmark = pytest.mark.timeout(60)


# -- 12. the allow-list admits actor classes only ----------------------------------------------


@pytest.fixture(params=["local", "remote", "remote-loose-pattern"])
def spawn_target(request, node):
    """(caller, target node): the caller's own node, a peer allowing ``call_actors.*``, or a
    peer whose pattern ``call_actors*`` also matches ``call_actors:<anything>``."""
    if request.param == "local":
        yield node, node
        return
    allow = ["call_actors.*"] if request.param == "remote" else ["call_actors*"]
    with lattica.Node([TCP], allow=allow) as b:
        node.connect(b.addrs[0])
        yield node, b


def test_allow_list_cannot_be_bypassed_to_non_actor_classes(spawn_target, tmp_path):
    caller, target = spawn_target
    marker = tmp_path / "spawned"
    for path in ("call_actors:subprocess.Popen", "call_actors.subprocess.Popen"):
        with pytest.raises(SpawnError):
            spawn_via_spawner(caller, target.peer_id, path, [["touch", str(marker)]], "x")
    time.sleep(0.3)
    assert not marker.exists(), "a process was started through the spawner"
    assert "x" not in spawner_names(target.peer_id)


def test_undecorated_class_is_not_spawnable(spawn_target):
    caller, target = spawn_target
    with pytest.raises(SpawnError):
        spawn_via_spawner(caller, target.peer_id, "call_actors.Plain", [], "plain")
    assert "plain" not in spawner_names(target.peer_id)


def test_on_stop_is_not_a_remote_method(where, token):
    r = where.spawn(ra.WithOnStop, token)
    assert r.ping.remote().result(5) == "pong"
    assert "on_stop" not in r.methods
    assert "on_stop" not in lattica.get_actor(r.name, node=where.node.peer_id).methods
    forged = lattica.ActorRef(where.node.peer_id, r.name, {"on_stop": "sync"})
    with pytest.raises(MethodNotFound):
        forged.on_stop.remote().result(5)
    assert ra.RECORDS[token] == []  # the hook did not run
    assert r.ping.remote().result(5) == "pong"


def test_spawner_local_helpers_are_no_remote_methods(node):
    """What the node itself uses (stopping every bound actor, the reserved resources, the
    holder of a name) is not callable by peers through the spawner."""
    with lattica.Node([TCP]) as b:
        node.connect(b.addrs[0])
        bound = lattica.ActorRef(
            b.peer_id, "spawner", {"stop_bound": "sync", "holder": "sync", "reserved_total": "sync"}
        )
        for method in ("stop_bound", "holder", "reserved_total"):
            with pytest.raises(MethodNotFound):
                getattr(bound, method).remote(*(["x"] if method == "holder" else [])).result(5)
        assert isinstance(spawner_names(b.peer_id), list)  # the spawner still serves
        # and every system actor serves exactly what its ref declares (a helper made public by
        # mistake would be a remote method, and a thread for sync methods at every start)
        from lattica._runtime import autonat_ref
        from lattica.actors.dht import dht_ref
        from lattica.actors.membership import membership_ref
        from lattica.actors.supervisor import checkpoints_ref

        actors = b._host.runtime.actors
        for ref in (
            spawner_ref(b.peer_id),
            checkpoints_ref(b.peer_id),
            dht_ref(b.peer_id),
            membership_ref(b.peer_id),
            autonat_ref(b.peer_id),
        ):
            assert set(actors[ref.name].ref.methods) == set(ref.methods), ref.name
            assert not actors[ref.name].needs_thread, ref.name
