"""Issue 46, finding 2 (providers and the record store): what many stranger identities can do to
the DHT's open keys when each stays within its own quota. Real nodes on loopback: a member node
holding the records, throwaway identities (each a node of its own mesh) that register or store
first, then members that must still find each other and store what they need."""

from __future__ import annotations

import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica.actors.dht.actor import dht_ref
from lattica.actors.pubsub.discovery import topic_key
from lattica.config import DhtConfig
from lattica.dht._records import Entry, StoreLimits, entry_to_wire
from lattica.errors import LatticaError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(180)

TCP = "/ip4/127.0.0.1/tcp/0"


def _as_strangers(n: int, target: lattica.Node, act) -> list:
    """Run ``act(stranger_node)`` as ``n`` fresh identities, one after the other (each a node of
    its own mesh, connected to ``target``); what each returned."""
    out = []
    for _ in range(n):
        with lattica.Node([TCP], mesh=MeshKey.generate(), pubsub=False, content=False, membership=False) as s:
            s.connect(target.addrs[0])
            out.append(act(s))
    return out


def test_providers_registered_first_by_strangers_do_not_hide_a_topics_members():
    """24 identities announce themselves as providers of a topic's key on its holder before a
    member does; a member looking the key up for pub-sub's first D = 6 dials finds the member
    first (before: the holder listed providers in arrival order and the asker took the first
    ones, all strangers: the subscribers never met). The same lookup serves content providers."""
    key = MeshKey.generate()
    topic = topic_key("jobs")
    with lattica.Node([TCP], mesh=key, pubsub=False) as a:
        _as_strangers(24, a, lambda s: call_as(s, dht_ref(a.peer_id), "add_provider", topic, 3600.0))
        with lattica.Node([TCP], mesh=key, pubsub=False) as b, lattica.Node([TCP], mesh=key, pubsub=False) as c:
            c.connect(a.addrs[0])
            call_as(c, dht_ref(a.peer_id), "add_provider", topic, 3600.0)  # (on the holder only)
            b.connect(a.addrs[0])
            dht = b._host.services.dht
            assert c.peer_id not in [p for p, _ in dht.store.providers(topic)]
            for _ in range(5):  # (strangers come back in random order; the member always first)
                found = b.run(dht.find_providers(topic, count=6), timeout=30)
                assert found[0] == c.peer_id and len(found) == 6, found


def test_a_holder_outside_the_mesh_cannot_vouch_for_its_friends():
    """A holder of another mesh answers with its own friends ranked as members: an asker of
    our mesh does not take its word (the ranking is ours, or a member holder's)."""
    with (
        lattica.Node([TCP], mesh=MeshKey.generate(), pubsub=False) as foreign,
        lattica.Node([TCP], mesh=MeshKey.generate(), pubsub=False) as b,
    ):
        favourites: list = []
        foreign._host.services.dht.store._member = lambda p: p in favourites  # it calls two of them members

        def provide(s) -> None:
            if len(favourites) < 2:
                favourites.append(s.peer_id)
            call_as(s, dht_ref(foreign.peer_id), "add_provider", b"cid", 3600.0)

        _as_strangers(8, foreign, provide)
        b.connect(foreign.addrs[0])
        answer = call_as(b, dht_ref(foreign.peer_id), "get_providers", b"cid")
        assert answer[2] == 2 and {p for p, _ in answer[0][:2]} == set(favourites)
        dht = b._host.services.dht
        firsts = {tuple(b.run(dht.find_providers(b"cid", count=8), timeout=30)[:2]) for _ in range(6)}
        assert len(firsts) > 1, "the foreign holder's favourites always came first"


def test_many_identities_fill_only_the_strangers_share_of_a_nodes_record_store():
    """25 identities each store up to their own quota (1 MiB) on a node whose store holds 4 MiB:
    together they get the strangers' share (a quarter), a member's records still go in (before:
    the store was full after four of them, and members were refused for a day)."""
    limits = StoreLimits(max_bytes=4 * 1024 * 1024, peer_bytes=1024 * 1024)
    key = MeshKey.generate()
    value = b"x" * 16 * 1024
    with lattica.Node([TCP], mesh=key, dht=DhtConfig(limits=limits)) as a:
        ref = dht_ref(a.peer_id)

        def fill(s) -> int:
            kept = 0
            for i in range(64):
                try:
                    call_as(
                        s,
                        ref,
                        "store",
                        f"junk/{s.peer_id}/{i}".encode(),
                        entry_to_wire(b"", Entry(value, time.time() + 86_000)),
                    )
                    kept += 1
                except LatticaError:
                    pass
            return kept

        kept = sum(_as_strangers(25, a, fill))
        store = a._host.services.dht.store
        records, held = store.stranger_usage
        assert held <= limits.max_bytes // 4 and kept == records, (held, kept)
        assert kept >= 50  # (they got their share: the bound is the share, not a refusal of everyone)
        with lattica.Node([TCP], mesh=key) as b:
            b.connect(a.addrs[0])
            for i in range(32):
                assert call_as(
                    b, ref, "store", f"mine/{i}".encode(), entry_to_wire(b"", Entry(value, time.time() + 3600))
                )


def test_a_mesh_topics_rendezvous_keeps_only_its_members_provider_records():
    """Issue 46, must-have 3: in a mesh of a key, a closed topic's subscribers meet under a key
    scoped to the mesh; its holders keep a provider record only with the provider's certificate
    of that mesh, so stranger identities cannot crowd it at all (open topics keep the plain key,
    ranked members first)."""
    from lattica.errors import RecordRejected

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key) as a, lattica.Node([TCP], mesh=key) as b:
        b.connect(a.addrs[0])
        for n in (a, b):
            lattica.dht.bootstrap(node=n).result(10)
        lattica.pubsub.subscribe("jobs", node=b)
        where = b._host.services.pubsub.discovery.rendezvous("jobs")
        assert where.startswith(b"lattica/mesh/" + key.public.hex().encode())
        store = a._host.services.dht.store
        assert wait_for(lambda: b.peer_id in [p for p, _ in store.providers(where)], timeout=15)

        def crowd(s) -> str:
            other = s._host.trust.presented  # (its certificate of its own mesh)
            for cert in ([], other):
                try:
                    call_as(s, dht_ref(a.peer_id), "add_provider", where, 3600.0, *([cert[0]] if cert else []))
                except RecordRejected as e:
                    last = str(e)
                else:
                    return "accepted"
            return last

        answers = _as_strangers(4, a, crowd)
        assert all("mesh" in why for why in answers), answers
        assert [p for p, _ in store.providers(where)] == [b.peer_id]
