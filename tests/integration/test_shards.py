"""Shard stubs between real node processes (docs/shards.md): providers register in the DHT and
a stub spreads calls over them, fails over when one is SIGKILLed, skips registrations that
outlived their provider or say what the provider does not serve, and says clearly when no
provider is left."""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest

import lattica
from helpers import wait_for
from lattica.dht._records import mesh_scoped
from lattica.errors import RemoteError, ShardUnavailable
from lattica.mesh.process import ServerProcess
from lattica.shards._client import REFRESH
from lattica.shards._keys import encode_registration, shard_key
from shard_actors import Stage

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ("--allow", "shard_actors.*")


@pytest.fixture
def mesh():
    """A driver node (this process) and three node processes, all connected."""
    lattica.shutdown()
    procs = [ServerProcess([TCP], *ALLOW).__enter__() for _ in range(3)]
    try:
        driver = lattica.init([TCP], allow=["shard_actors.*"])
        for p in procs:
            driver.connect(p.addr("tcp"))
        yield driver, procs
    finally:
        lattica.shutdown()
        for p in procs:
            if p.proc.poll() is None:
                p.__exit__(None, None, None)


def _served(driver, procs, shard, k=2, on=(0, 1)):
    refs = []
    for i in on:
        ref = Stage.options(node=lattica.PeerId.from_string(procs[i].peer_id)).remote(k)
        lattica.shards.serve(ref, "math", shard).result(10)
        refs.append(ref)
    return refs


def test_a_stub_spreads_calls_over_the_providers_and_fails_over_when_one_is_killed(mesh):
    driver, procs = mesh
    _served(driver, procs, {"layers": (0, 4)})
    stub = lattica.shards.stub("math", {"layers": (0, 4)}, timeout=5.0, node=driver)
    assert len(stub.providers().result(10)) == 2
    pids = collections.Counter(stub.who.remote().result(10) for _ in range(40))
    assert set(pids) == {procs[0].pid, procs[1].pid}  # both serve
    assert [stub.forward.remote(i).result(10) for i in range(5)] == [0, 2, 4, 6, 8]
    # one provider is SIGKILLed: calls still succeed, on the other
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].proc.wait(10)
    got = [stub.forward.remote(i).result(20) for i in range(20)]
    assert got == [2 * i for i in range(20)]
    assert {stub.who.remote().result(10) for _ in range(10)} == {procs[1].pid}
    # the method's own error is the caller's, not a reason to fail over
    with pytest.raises(RemoteError, match="the method's own error"):
        stub.boom.remote().result(10)


def test_each_call_s_latency_reaches_the_picker_below_a_millisecond_too(mesh, monkeypatch):
    """The picker ranks providers by (in flight + load + 1) x latency. Timed on the node loop's
    clock, which under uvloop moves in whole milliseconds, a call on loopback took 0.0 s most of
    the time: a provider scored 0 whatever its load, and won every pick."""
    from lattica.shards._select import Picker

    seen: list[float] = []
    succeeded = Picker.succeeded

    def record(self, p, seconds: float) -> None:
        seen.append(seconds)
        succeeded(self, p, seconds)

    monkeypatch.setattr(Picker, "succeeded", record)
    driver, procs = mesh
    _served(driver, procs, {"layers": (0, 4)})
    stub = lattica.shards.stub("math", {"layers": (0, 4)}, timeout=5.0, node=driver)
    assert [stub.forward.remote(i).result(10) for i in range(30)] == [2 * i for i in range(30)]
    assert len(seen) == 30 and all(0 < s < 5 for s in seen), seen


def test_when_every_provider_is_gone_the_error_names_the_shard(mesh):
    driver, procs = mesh
    _served(driver, procs, "s-lost", on=(0,))
    stub = lattica.shards.stub("math", "s-lost", timeout=2.0, within=4.0, node=driver)
    assert stub.forward.remote(1).result(10) == 2
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].proc.wait(10)
    with pytest.raises(ShardUnavailable, match="no provider of shard 's-lost' of service 'math'") as ei:
        stub.forward.remote(1).result(30)
    assert procs[0].peer_id[-8:] in str(ei.value) or "PeerUnreachable" in str(ei.value) or "ActorDied" in str(ei.value)
    # and a shard nobody serves
    with pytest.raises(ShardUnavailable, match="none is registered"):
        lattica.shards.stub("math", "nobody", within=1.0, node=driver).forward.remote(1).result(30)


def test_a_stale_registration_of_a_dead_node_is_skipped_without_waiting_the_timeout(mesh):
    driver, procs = mesh
    _served(driver, procs, "s-stale")
    os.kill(procs[0].pid, signal.SIGKILL)  # its registration stays in the DHT until it expires
    procs[0].proc.wait(10)
    with lattica.Node([TCP]) as fresh:  # a new caller, which never saw the dead node
        fresh.connect(procs[2].addr("tcp"))
        stub = lattica.shards.stub("math", "s-stale", timeout=30.0, node=fresh)
        t0 = time.monotonic()
        assert [stub.forward.remote(i).result(60) for i in range(6)] == [0, 2, 4, 6, 8, 10]
        assert time.monotonic() - t0 < 15  # (not one attempt's full 30 s: the dead one is refused at once or skipped)


def test_a_registration_that_says_another_shard_is_found_out_and_left_alone(mesh):
    driver, procs = mesh
    _served(driver, procs, "s-real", on=(1,))
    # the driver registers an actor of its own for "s-real" while it serves something else
    impostor = Stage.remote(100)
    impostor.who.remote().result(10)
    rt = driver.host.runtime
    key = shard_key("math", "s-real")
    local = rt.actors[impostor.name].ref
    driver.run(_keep(rt, key, encode_registration([(local, 0)], rt.host.trust.presented)), timeout=10)
    with lattica.Node([TCP]) as caller:
        caller.connect(driver.addrs[0])
        caller.connect(procs[1].addr("tcp"))
        stub = lattica.shards.stub("math", "s-real", timeout=5.0, node=caller)
        assert wait_for(lambda: len(stub.providers().result(10)) == 2, timeout=10)
        assert {stub.forward.remote(1).result(20) for _ in range(10)} == {2}  # never 100
        banned = [p for p in stub._picker.providers.values() if p.ref.peer_id == driver.peer_id]
        assert banned and banned[0].banned_until > time.monotonic() + 60


async def _keep(rt, key, value):
    """Keep ``value`` as this node's registration under shard key ``key``, in its mesh as the
    shards service keeps its own (a registration the service itself would not write)."""
    cert = rt.host.services.shards._membership()
    rt.host.services.dht.keep_live(mesh_scoped(key, cert.mesh), lambda: value, subkey=cert)


def test_only_the_node_that_spawned_an_actor_registers_it_elsewhere(mesh):
    from lattica.errors import ActorNotFound, PermissionDenied

    driver, procs = mesh
    ref = Stage.options(node=lattica.PeerId.from_string(procs[0].peer_id)).remote(3)
    ref.who.remote().result(10)
    with lattica.Node([TCP]) as other:
        other.connect(procs[0].addr("tcp"))
        with pytest.raises(PermissionDenied, match="only the node that spawned"):
            lattica.shards.serve(ref, "math", "s-owned", node=other).result(10)
        ghost = lattica._runtime.ActorRef(ref.peer_id, "no-such-actor", {})
        with pytest.raises(ActorNotFound):
            lattica.shards.serve(ghost, "math", "s-owned", node=other).result(10)
    lattica.shards.serve(ref, "math", "s-owned").result(10)
    assert [r.name for r, _ in lattica.shards.providers("math", "s-owned").result(10)] == [ref.name]


def test_a_provider_whose_node_cannot_be_asked_is_skipped_even_for_calls_that_are_not_idempotent(mesh):
    """The check before a first call ran nothing: its failure (here a frozen node) is a reason
    to go elsewhere, whatever the call; and ``within`` bounds the whole call."""
    driver, procs = mesh
    _served(driver, procs, "s-frozen")
    os.kill(procs[0].pid, signal.SIGSTOP)
    try:
        stub = lattica.shards.stub("math", "s-frozen", timeout=1.0, idempotent=False, hedge=False)
        assert [stub.forward.remote(i).result(30) for i in range(4)] == [0, 2, 4, 6]
        assert {stub.who.remote().result(10) for _ in range(4)} == {procs[1].pid}
        os.kill(procs[1].pid, signal.SIGSTOP)
        fresh = lattica.shards.stub("math", "s-frozen", timeout=5.0, within=1.0)
        t0 = time.monotonic()
        with pytest.raises(ShardUnavailable):
            fresh.forward.remote(1).result(30)
        assert time.monotonic() - t0 < 4  # (within=1.0: not the 3 s check nor the 5 s attempt, twice)
    finally:
        for p in procs[:2]:
            os.kill(p.pid, signal.SIGCONT)


def test_refs_read_from_registrations_are_plain_and_serving_is_bounded(mesh):
    from lattica._runtime import ActorRef
    from lattica.errors import PermissionDenied

    driver, procs = mesh
    rt = driver.host.runtime
    local = Stage.remote(1)
    local.who.remote().result(10)
    real = rt.actors[local.name].ref
    decoy = ActorRef(
        real.peer_id, real.name, real.methods, stable=True, supervisor=ActorRef(real.peer_id, "elsewhere", {})
    )
    driver.run(
        _keep(rt, shard_key("math", "s-plain"), encode_registration([(decoy, 0)], rt.host.trust.presented)), timeout=10
    )
    assert wait_for(lambda: lattica.shards.providers("math", "s-plain").result(10), timeout=10)
    got = lattica.shards.providers("math", "s-plain").result(10)
    assert got and not got[0][0].stable and got[0][0].supervisor is None
    # serving the same actor again is a no-op; a flood of serve calls from one node is refused
    ref = Stage.options(node=lattica.PeerId.from_string(procs[2].peer_id)).remote(1)
    lattica.shards.serve(ref, "math", "s-again").result(10)
    lattica.shards.serve(ref, "math", "s-again").result(10)
    assert len(lattica.shards.providers("math", "s-again").result(10)) == 1
    with pytest.raises(PermissionDenied, match="too often"):
        for i in range(60):
            lattica.shards.serve(ref, "math", f"s-flood-{i}").result(10)


def test_a_stream_through_a_stub_fails_over_before_its_first_item_and_not_after(mesh):
    """``stub.method.stream(...)``: a stream is tried on another provider while nothing of it
    arrived (here: its provider was SIGKILLed and its registration is still there), runs under
    the stream's credit, and after its first item a provider's death is the caller's error."""
    driver, procs = mesh
    _served(driver, procs, "s-stream", k=3)
    stub = lattica.shards.stub("math", "s-stream", timeout=5.0, node=driver)
    got = list(stub.count.stream(200))  # more than a credit window: the producer waits for the consumer
    assert [x[1] for x in got] == [3 * i for i in range(200)] and len({x[0] for x in got}) == 1
    with pytest.raises(RemoteError, match="the stream's own error"):  # the method's own: not failed over
        list(stub.count_then_boom.stream(3))
    # the provider that served (measured, so preferred) is SIGKILLed
    victim, survivor = (procs[0], procs[1]) if procs[0].pid == got[0][0] else (procs[1], procs[0])
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    dead = lattica.PeerId.from_string(victim.peer_id)
    # the dead one is tried (two choices pick either at first; a failure leaves it alone for a
    # while), or no longer offered at all (a new lookup of the providers leaves out a member
    # found dead): either way every stream is served whole, by a survivor
    tried_dead = lambda: any(p.ref.peer_id == dead and p.failures for p in stub._picker.providers.values())  # noqa: E731
    gone = lambda: all(p.ref.peer_id != dead for p in stub._picker.providers.values())  # noqa: E731
    # What was measured is forgotten, so the two choices pick either provider (once measured, the
    # survivor would otherwise win every pick and the dead one might never be tried); failing
    # that, the next lookup (every REFRESH s) leaves the dead one out once membership found it dead.
    for p in stub._picker.providers.values():
        p.latency = None
    deadline = time.monotonic() + 3 * REFRESH
    while not (tried_dead() or gone()):
        assert time.monotonic() < deadline, f"the dead provider was neither tried nor dropped: {stub._picker.providers}"
        items = list(stub.count.stream(5))
        assert [x[1] for x in items] == [0, 3, 6, 9, 12] and {x[0] for x in items} == {survivor.pid}
        time.sleep(0.05)
    # a stream under way when its provider dies ends with an error, never silently short
    it = iter(stub.count.stream(1000, 0.01))
    assert next(it)[0] == survivor.pid
    os.kill(survivor.pid, signal.SIGKILL)
    with pytest.raises(lattica.errors.LatticaError):
        for _ in it:
            pass


def test_a_stranger_cannot_write_into_a_mesh_s_shard_keys(mesh):
    """Shard keys live within the mesh (scoped by its admission key, members' certificates as
    subkeys): a node of another mesh can neither register there nor fill the key, under its own
    certificate or its PeerId; the mesh's stubs see their members' providers only."""
    from lattica.errors import StoreFailed
    from lattica.trust import MeshKey

    driver, procs = mesh
    _served(driver, procs, "s-mine", on=(1,))
    ours = driver.host.services.shards._membership()
    key = mesh_scoped(shard_key("math", "s-mine"), ours.mesh)
    with lattica.Node([TCP], mesh=MeshKey.generate()) as stranger:
        for p in procs:
            stranger.connect(p.addr("tcp"))
        theirs = stranger.host.services.shards._membership()
        assert theirs is not None and theirs.mesh != ours.mesh
        value = encode_registration([(lattica.ActorRef(stranger.peer_id, "x", {}), 0)], [])

        async def put(subkey):
            return await stranger.host.services.dht.put(key, value, subkey=subkey, ttl=60)

        for subkey in (theirs, stranger.peer_id):
            with pytest.raises(StoreFailed):
                stranger.run(put(subkey), timeout=20)
    stub = lattica.shards.stub("math", "s-mine", timeout=5.0, node=driver)
    assert [r.peer_id for r in stub.providers().result(10)] == [lattica.PeerId.from_string(procs[1].peer_id)]
    assert stub.forward.remote(3).result(10) == 6
