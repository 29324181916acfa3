"""Only a member speaks for itself (docs/security.md, membership): real nodes of one mesh, one of
them hostile. It gossips rows about another member that the member never signed (a newer
incarnation with huge resources, a goodbye), replays that member's older genuine statement, and
vouches for an outsider whose statement is genuinely signed but who holds no certificate of the
mesh. The honest node's view does not move, and the outsider never enters its member table;
while the honest member's own statements, passed on by others, are believed everywhere."""

from __future__ import annotations

import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._membership import ALIVE, LEFT, statement
from lattica.actors.membership import membership_ref
from lattica.trust import MemberNotary, MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"


def _row(node, mid, inc, state, info, *, seal_as=None):
    """A rumor about ``mid`` sealed by ``seal_as`` (a node: its key and certificates)."""
    signer = seal_as or node
    notary = MemberNotary(signer.keypair, signer.trust)
    return [mid, inc, state, info, notary.seal(statement(mid, inc, state, info))]


def _view(node):
    return {r["peer_id"]: r for r in node.nodes()}


def test_rows_a_member_never_signed_move_nothing():
    mesh, other = MeshKey.generate(), MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=mesh) as host,
        lattica.Node([TCP], mesh=mesh) as honest,
        lattica.Node([TCP], mesh=mesh) as liar,
        lattica.Node([TCP], mesh=mesh) as far,
        lattica.Node([], mesh=other) as outsider,
    ):
        honest.connect(host.addrs[0])
        liar.connect(host.addrs[0])
        far.connect(host.addrs[0])  # far never talks to honest: it knows it only from others' gossip
        hid = str(honest.peer_id)
        assert wait_for(
            lambda: _view(host).get(hid, {}).get("cpu") is not None, timeout=10
        )  # its own statement arrived
        assert wait_for(
            lambda: _view(far).get(hid, {}).get("state") == "alive", timeout=10
        )  # ...and, passed on, is believed
        core = honest._host.services.membership.core
        old = [
            hid,
            core.me.incarnation,
            ALIVE,
            dict(core.me.info),
            core.me.proof,
        ]  # a genuine statement, kept for a replay
        honest._host.services.membership.load_changed()  # (a newer statement: its incarnation rises)
        honest.run(_bump(honest), timeout=5)
        assert wait_for(lambda: _view(host)[hid]["incarnation"] > old[1], timeout=10)
        before = _view(host)[hid]
        inc = before["incarnation"]
        gossip = membership_ref(host.peer_id)
        forged = [
            _row(
                liar, hid, inc + 5, ALIVE, {"cpu": 1e6, "memory": 1 << 44, "gpus": 64}, seal_as=liar
            ),  # signed, by the wrong key
            [hid, inc + 5, ALIVE, {"cpu": 1e6}, None],  # not signed at all
            _row(liar, hid, inc, LEFT, {}, seal_as=liar),  # a goodbye it never said
            [hid, inc + 1, LEFT, {}, old[4]],  # its real signature, on other words
            old,  # its own, older statement, replayed
        ]
        call_as(liar, gossip, "gossip", {"rumors": forged, "view": forged})
        # an outsider's statement is genuinely its own, but no certificate of this mesh admits it
        out = _row(outsider, str(outsider.peer_id), 0, ALIVE, {"cpu": 1e6}, seal_as=outsider)
        call_as(liar, gossip, "gossip", {"rumors": [out]})
        time.sleep(1.0)  # a few gossip rounds: had anything been believed, it would show
        after = _view(host)[hid]
        assert after["state"] == "alive" and after["incarnation"] == inc and after["cpu"] == before["cpu"]
        assert str(outsider.peer_id) not in _view(host)
        # and the control: the honest member's own goodbye, passed on by the liar to a node that
        # does not watch it, is believed there at once
        bye = honest._host.services.membership.core.leave()
        assert _view(far)[hid]["state"] == "alive"
        call_as(liar, membership_ref(far.peer_id), "gossip", bye)
        assert _view(far)[hid]["state"] == "left"


async def _bump(node):
    svc = node._host.services.membership
    svc.core.update_info({**svc.core.me.info, "labels": {"bumped": "yes"}})


def test_hearsay_verdicts_huge_incarnations_fake_members_and_bad_resources_move_nothing():
    """The issue's membership attacks, by one member against real nodes: a forged "dead" about a
    live member (to a third node, and to the victim itself), a rumor with incarnation 2**64-1,
    4,096 made-up members in one message, and its own statement with ``cpu="lots"``."""
    mesh = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=mesh) as host,
        lattica.Node([TCP], mesh=mesh) as honest,
        lattica.Node([TCP], mesh=mesh) as liar,
    ):
        honest.connect(host.addrs[0])
        liar.connect(host.addrs[0])
        liar.connect(honest.addrs[0])
        hid, lid = str(honest.peer_id), str(liar.peer_id)
        assert wait_for(lambda: _view(host).get(hid, {}).get("state") == "alive" and lid in _view(host), timeout=10)
        inc = _view(host)[hid]["incarnation"]
        dead = [hid, inc, "dead", {}, None]
        call_as(liar, membership_ref(host.peer_id), "gossip", {"rumors": [dead]})  # to a third node
        call_as(
            liar, membership_ref(honest.peer_id), "gossip", {"rumors": [[hid, inc, "dead", {}, None]]}
        )  # to the victim
        huge = [hid, 2**64 - 1, "dead", {}, None]
        call_as(liar, membership_ref(host.peer_id), "gossip", {"rumors": [huge], "view": [huge]})
        fakes = [[str(lattica.KeyPair.generate().peer_id), 0, ALIVE, {"cpu": 1e6}, None] for _ in range(4096)]
        call_as(liar, membership_ref(host.peer_id), "gossip", {"view": fakes})
        lies = liar._host.services.membership.core
        bad = [lid, lies.me.incarnation + 1, ALIVE, {"cpu": "lots"}, None]
        bad[4] = MemberNotary(liar.keypair, liar.trust).seal(statement(*bad[:4]))  # its own word, but not a valid row
        call_as(liar, membership_ref(host.peer_id), "gossip", {"rumors": [bad]})
        time.sleep(1.0)  # a few gossip rounds
        view = _view(host)
        # (the victim may refute what it heard of itself: a newer incarnation, still alive)
        assert view[hid]["state"] == "alive" and inc <= view[hid]["incarnation"] < 2**48, (
            "one member's word kills nobody"
        )
        assert honest._host.services.membership.core.me.state == ALIVE, (
            "the victim did not take the liar's word for its death"
        )
        assert len(view) <= 3, f"made-up members entered the view: {len(view)} rows"
        assert view[lid].get("cpu") != "lots" and host.nodes()  # the bad row was skipped; placement's view still reads
