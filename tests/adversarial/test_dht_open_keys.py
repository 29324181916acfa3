"""Issue 46, finding 2 (the part closed so far): a stranger cannot block a name's DHT key with
unsigned junk. Real nodes on loopback: two members of one mesh, a stranger of another that fills
``lattica/actor/bank`` with 1,100 junk subkeys (the key's cap is 1,024) before a member names an
actor "bank"; the other member's ``get_actor("bank")`` must still find it."""

from __future__ import annotations

import pytest

import lattica
import sample_actors as sa
from lattica.errors import LatticaError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"


def test_junk_subkeys_from_a_stranger_cannot_hide_a_members_name():
    key = MeshKey.generate()
    lattica.shutdown()
    try:
        with (
            lattica.Node([TCP], mesh=key, allow=["sample_actors.*"]) as a,
            lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
        ):
            b = lattica.init(mesh=key)
            b.connect(a.addrs[0])
            stranger.connect(a.addrs[0])
            stranger.connect(b.addrs[0])

            async def drop(key, record):  # (the stranger keeps nothing for others: only what it sent counts)
                return False

            stranger._host.runtime.actors["dht"].bound["store"] = drop
            for n in (a, b, stranger):
                lattica.dht.bootstrap(node=n).result(10)
            puts = [
                lattica.dht.put("lattica/actor/bank", b"junk", subkey=f"junk-{i}", ttl=300, node=stranger)
                for i in range(1100)
            ]
            refused = 0
            for f in puts:
                try:
                    f.result(30)
                except LatticaError:
                    refused += 1

            async def name():
                ref = sa.Counter.options(name="bank").remote(5)
                await ref.get.remote()
                return ref

            a.run(name(), timeout=30)
            found = lattica.get_actor("bank", timeout=10)
            assert found.peer_id == a.peer_id and found.get.remote().result(10) == 5
            assert (
                refused == 1100
            )  # (every member refuses a name's record that its maker did not sign under its own PeerId)
    finally:
        lattica.shutdown()


def test_a_holder_full_of_strangers_names_does_not_crowd_out_a_members():
    """A DHT node outside the mesh holds a name's key full of strangers' signed registrations
    (each identity its own subkey); a member's registration is on another holder. The member
    reading the name merges both: the member's record takes a stranger's place (before: the merge
    stopped at the key's subkey cap and the member's record was dropped: ``ActorNotFound``)."""
    import asyncio
    import time

    from lattica._identity import KeyPair
    from lattica.config import DhtConfig
    from lattica.dht._records import REGISTRY_PREFIX, StoreLimits, encode_subkey, sign_entry

    small = DhtConfig(limits=StoreLimits(max_subkeys=64))
    key = MeshKey.generate()
    lattica.shutdown()
    with (
        lattica.Node([TCP], mesh=MeshKey.generate(), dht=small) as foreign,
        lattica.Node([TCP], mesh=key, dht=small, allow=["sample_actors.*"]) as m,
    ):
        name = REGISTRY_PREFIX + b"bank"
        store = foreign._host.services.dht.store
        for i in range(64):
            kp = KeyPair.generate()
            sk = encode_subkey(kp.peer_id)
            store.put(name, sk, sign_entry(kp, name, sk, b"junk", time.time() + 280), foreign.peer_id)
        m.connect(foreign.addrs[0])
        lattica.dht.bootstrap(node=m).result(10)

        async def register():
            ref = sa.Counter.options(name="bank").remote(5)
            await ref.get.remote()

        m.run(register(), timeout=30)
        bound = m._host.runtime.actors["dht"].bound
        answer = bound["find_value"]

        async def farther(kid):  # (the member's holder answers after the foreign one)
            await asyncio.sleep(0.5)
            return await answer(kid)

        bound["find_value"] = farther
        with lattica.Node([TCP], mesh=key, dht=small) as r:
            r.connect(foreign.addrs[0])
            found = r.run(r._host.services.dht.resolve_name("bank", within=5), timeout=30)
            assert found.peer_id == m.peer_id


def test_an_invited_member_cannot_squat_an_administrators_name():
    """Issue 46, finding 6: an invited (plain) member names its own actor like an
    administrator's, after it, so its registration is the freshest; members resolving the name
    still get the administrator's (before: the freshest registration of any member won)."""
    import time

    from lattica._identity import KeyPair
    from lattica.actors.dht.upkeep import name_key

    key = MeshKey.generate()
    km = KeyPair.generate()
    lattica.shutdown()
    with (
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"]) as admin,
        lattica.Node([TCP], keypair=km, mesh=key.issue(km.peer_id), allow=["sample_actors.*"]) as member,
        lattica.Node([TCP], mesh=key) as reader,
    ):
        for n in (member, reader):
            n.connect(admin.addrs[0])
        for n in (admin, member, reader):
            lattica.dht.bootstrap(node=n).result(10)

        async def name(value):
            ref = sa.Counter.options(name="bank").remote(value)
            await ref.get.remote()

        admin.run(name(5), timeout=30)
        time.sleep(0.5)
        member.run(name(666), timeout=30)
        dht = reader._host.services.dht
        deadline = time.monotonic() + 10
        while len(reader.run(dht.get(name_key("bank")), timeout=10)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(reader.run(dht.get(name_key("bank")), timeout=10)) == 2
        found = reader.run(dht.resolve_name("bank"), timeout=30)
        assert found.peer_id == admin.peer_id
