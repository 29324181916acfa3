"""A stable ref follows its actor through its supervisor, not through the DHT (docs/security.md,
stable refs). An invited member registers a supervised child's name for an actor of its own,
with a far longer TTL than the real registration (the freshest registration used to win): when
the child is restarted, calls through the stable ref go to its next incarnation, which the
supervisor locates, and never to the member's impostor."""

from __future__ import annotations

import pytest

import lattica
import sample_actors as sa
from helpers import spawn_local, wait_for
from lattica.config import DhtConfig
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]


def _call(node, ref, method, *args, timeout=20, **kwargs):
    async def go():
        return await getattr(ref, method).remote(*args, **kwargs)

    return node.run(go(), timeout=timeout)


def test_a_member_s_longer_lived_registration_of_a_child_s_name_does_not_capture_its_stable_ref():
    key = MeshKey.generate()
    kl = lattica.KeyPair.generate()
    w = {"labels": {"role": "worker"}, "allow": ALLOW}
    with (
        lattica.Node([TCP], mesh=key, allow=ALLOW) as host,
        lattica.Node([TCP], mesh=key, **w) as spare,
        lattica.Node(
            [TCP], keypair=kl, mesh=key.issue(kl.peer_id, admin=True), allow=ALLOW, dht=DhtConfig(name_ttl=300)
        ) as liar,
    ):
        # (an administrator: a plain member's registration no longer wins over the child's
        # node's, an administrator's, at all: test_dht_open_keys.py; the stable ref must not
        # follow even a registration that does win plain name resolution)
        worker = lattica.Node([TCP], mesh=key, **w).start()
        try:
            nodes = (host, spare, liar, worker)
            for n in nodes[1:]:
                n.connect(host.addrs[0])
            for n in nodes:
                lattica.dht.bootstrap(node=n).result(10)
            assert wait_for(lambda: all(len(x.nodes()) == 4 for x in nodes), timeout=10)

            async def start():
                sup = lattica.Supervisor.remote(strategy="one_for_one", max_restarts=5, within=60)
                return sup, await sup.start_child.remote(
                    sa.Counter, [100], id="w", labels={"role": "worker"}, node=str(worker.peer_id)
                )

            sup, child = host.run(start(), timeout=30)
            assert child.stable and child.supervisor is not None and child.peer_id == worker.peer_id
            assert _call(host, child, "incr") == 101
            # the impostor: a Counter of the liar's own under the child's name, registered for
            # 5 minutes (the real registration: 60 s)
            impostor = spawn_local(liar, sa.Counter, 666, name=child.name)
            liar.run(_register(liar, child.name, impostor), timeout=5)
            assert wait_for(
                lambda: _resolves_to(host, child.name) == liar.peer_id, timeout=10
            )  # the attack is in place
        finally:
            worker.stop()  # the child's node leaves: its supervisor restarts it on the other worker
        assert wait_for(lambda: _call(host, sup, "which_children")[0]["restarts"] == 1, timeout=15)
        assert _call(host, child, "incr", 5) == 105  # the next incarnation (fresh state), not the impostor's 671
        assert child.peer_id == spare.peer_id
        assert _call(liar, impostor, "get") == 666  # nothing reached it


async def _register(node, name, ref):
    node._host.services.dht.register_name(name, ref)


def _resolves_to(node, name):
    async def go():
        try:
            return (await node._host.services.dht.resolve_name(name)).peer_id
        except lattica.errors.LatticaError:
            return None

    return node.run(go(), timeout=10)
