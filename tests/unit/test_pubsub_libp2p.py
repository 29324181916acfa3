"""libp2p GossipSub messages in our router, sans-IO (lattica.pubsub._libp2p): ids in each
implementation's dialect, batches to and from RPCs, signatures screened before the router, and
the router's rules for plain libp2p peers (no bundles, no choking, no authors' floors)."""

from __future__ import annotations

import pytest

from lattica._identity import KeyPair
from lattica.actors.pubsub import wire
from lattica.actors.pubsub.bundle import Bundle
from lattica.errors import ProtocolError
from lattica.pubsub import _gossipsub_wire as gs
from lattica.pubsub._libp2p import Dialect, Signed, envelope, from_gossipsub, screen, to_gossipsub
from lattica.pubsub._router import ACCEPT, LIBP2P_MARK, GossipParams, Router, Rpc, is_libp2p_id

ALICE = KeyPair.from_seed(bytes(range(32)))
BOB = KeyPair.from_seed(bytes(range(1, 33)))


def _signed(kp: KeyPair, data: bytes = b"hello", seqno: int = 7, topic: str = "t") -> gs.Message:
    return gs.sign(kp, topic, data, seqno.to_bytes(8, "big"))


def test_an_envelope_takes_libp2ps_default_id_with_the_mark() -> None:
    m = _signed(ALICE)
    env = envelope(m)
    assert env.id == gs.default_id(m) + LIBP2P_MARK
    assert is_libp2p_id(env.id)
    assert (env.author, env.seqno, env.size) == (ALICE.peer_id.to_bytes(), 7, 5)
    assert type(env.data) is Signed and env.data.items == [b"hello"]


@pytest.mark.parametrize("seqno", [b"", b"\x01" * 7, b"\x01" * 9])
def test_a_seqno_of_another_length_is_refused(seqno: bytes) -> None:
    m = gs.Message("t", b"x", ALICE.peer_id, seqno, b"sig")
    with pytest.raises(ProtocolError):
        envelope(m)


def test_ids_in_the_bytes_dialect_round_trip() -> None:
    mid = envelope(_signed(ALICE)).id
    wid = Dialect.BYTES.wire(mid)
    assert wid == ALICE.peer_id.to_bytes() + (7).to_bytes(8, "big")
    assert Dialect.BYTES.ours(wid) == mid
    assert Dialect.BYTES.ours(b"short") is None
    assert Dialect.BYTES.ours(b"\x00" * 40) is None  # no PeerId before the seqno


@pytest.mark.parametrize("seqno", [0, 7, 10, 1_700_000_000_123_456_789, (1 << 64) - 1])
def test_ids_in_rusts_text_dialect_round_trip(seqno: int) -> None:
    """rust-libp2p's default id: the author in base58, then the seqno in decimal (whose first
    digits base58 shares: only one split names a PeerId)."""
    mid = envelope(_signed(ALICE, seqno=seqno)).id
    wid = Dialect.TEXT.wire(mid)
    assert wid == f"{ALICE.peer_id}{seqno}".encode()
    assert Dialect.TEXT.ours(wid) == mid


@pytest.mark.parametrize(
    "wid",
    [b"", b"12345", b"\xff\xfe", b"12D3KooWnotapeer99", f"{ALICE.peer_id}".encode(), f"{ALICE.peer_id}x1".encode()],
)
def test_text_ids_that_name_no_message_are_skipped(wid: bytes) -> None:
    assert Dialect.TEXT.ours(wid) is None


def test_the_dialect_follows_the_agent() -> None:
    assert Dialect.of("rust-libp2p/0.45.0") is Dialect.TEXT
    assert Dialect.of("p2pd/0.1") is Dialect.BYTES
    assert Dialect.of("js-libp2p/3.3.11 node/22.23.5") is Dialect.KEY


def test_ids_in_jss_key_dialect_round_trip() -> None:
    """@libp2p/gossipsub's default id: the author's protobuf public key, then the seqno; either
    bytes form reads in both dialects."""
    mid = envelope(_signed(ALICE)).id
    wid = Dialect.KEY.wire(mid)
    assert wid == ALICE.public_key_protobuf() + (7).to_bytes(8, "big")
    assert Dialect.KEY.ours(wid) == Dialect.BYTES.ours(wid) == mid
    assert Dialect.KEY.ours(Dialect.BYTES.wire(mid)) == mid
    assert Dialect.KEY.ours(b"\x08\x01\x12\x20" + b"\x00" * 31 + b"\x00" * 8) is None


def _bundle_env(topic: str = "t") -> wire.Envelope:
    b = Bundle([b"one"])
    author = BOB.peer_id.to_bytes()
    return wire.envelope(topic, author, 5, b, BOB.sign(b.signed_bytes(topic, author, 5)))


def test_a_batch_for_a_libp2p_peer_carries_only_libp2p_messages_and_their_ids() -> None:
    lib = envelope(_signed(ALICE))
    ours = _bundle_env()
    rpc = Rpc(
        subscribe=[("t", True)],
        messages=[lib, ours],
        ihave=[("t", [lib.id, ours.id]), ("u", [ours.id])],
        iwant=[lib.id, ours.id],
        graft=["t"],
        prune=[("t", 59.2)],
        idontwant=[lib.id, ours.id],
        choke=["t"],
    )
    (out,) = to_gossipsub(rpc, Dialect.BYTES, idontwant=True)
    wid = Dialect.BYTES.wire(lib.id)
    assert out.subscriptions == (gs.SubOpts(True, "t"),)
    assert out.publish == (lib.data.msg,)
    assert out.control.ihave == (gs.IHave("t", (wid,)),)
    assert out.control.iwant == (wid,) and out.control.idontwant == (wid,)
    assert out.control.graft == ("t",) and out.control.prune == (gs.Prune("t", (), 60),)
    (v11,) = to_gossipsub(rpc, Dialect.BYTES, idontwant=False)
    assert v11.control.idontwant == ()  # (/meshsub/1.1.0 has none)
    assert to_gossipsub(Rpc(messages=[ours], choke=["t"]), Dialect.BYTES, True) == []


def test_messages_beyond_one_rpcs_budget_go_in_several() -> None:
    big = [envelope(_signed(ALICE, bytes(300_000), seqno=i)) for i in range(7)]
    rpcs = to_gossipsub(Rpc(messages=big, graft=["t"]), Dialect.BYTES, True)
    assert len(rpcs) == 3 and sum(len(r.publish) for r in rpcs) == 7
    assert all(len(gs.encode(r)) <= gs.MAX_RPC for r in rpcs)
    assert [m for r in rpcs for m in r.publish] == [e.data.msg for e in big]


def test_a_peers_rpc_as_a_batch_and_its_bad_signatures_screened() -> None:
    good = _signed(ALICE, b"good", 1)
    forged = gs.Message("t", b"forged", ALICE.peer_id, (2).to_bytes(8, "big"), good.signature)
    anonymous = gs.Message("t", b"x", None, (3).to_bytes(8, "big"))
    wid = Dialect.BYTES.wire(envelope(good).id)
    rpc = gs.RPC(
        (gs.SubOpts(True, "t"),),
        (good, forged, anonymous),
        gs.Control((gs.IHave("t", (wid, b"junk")),), (wid,), ("t",), (gs.Prune("t", (), 0),), (wid,)),
    )
    batch, bad = from_gossipsub(gs.decode(gs.encode(rpc)), Dialect.BYTES)
    assert bad == ["t"]  # the anonymous one
    assert [e.data.msg.data for e in batch.messages] == [b"good", b"forged"]
    assert batch.ihave == [("t", [envelope(good).id])] and batch.iwant == [envelope(good).id]
    assert batch.graft == ["t"] and batch.prune == [("t", 0.0)]
    assert screen(batch, lambda mid: False) == ["t"]
    assert [e.data.msg.data for e in batch.messages] == [b"good"]


def test_a_seen_id_is_not_checked_again() -> None:
    forged = gs.Message("t", b"forged", ALICE.peer_id, (2).to_bytes(8, "big"), b"\x00" * 64)
    batch = Rpc(messages=[envelope(forged)])
    assert screen(batch, lambda mid: True) == [] and len(batch.messages) == 1


def test_a_libp2p_message_travels_whole_between_lattica_nodes() -> None:
    lib = envelope(_signed(ALICE, b"between us"))
    raw = wire.encode(Rpc(messages=[lib, _bundle_env()]))
    back = wire.decode(raw, 1 << 20)
    assert back.messages[0].id == lib.id and back.messages[0].data.msg == lib.data.msg
    assert type(back.messages[1].data) is Bundle


@pytest.mark.parametrize(
    "item",
    [
        ["t", b"\xff\xff"],
        ["t", 5],
        ["other", gs.encode_message(_signed(ALICE))],
        ["t", gs.encode_message(gs.Message("t", b"x", ALICE.peer_id, b"\x01", b"s"))],
        ["t", gs.encode_message(_signed(ALICE, bytes(2000)))],
    ],
)
def test_a_malformed_libp2p_message_refuses_the_batch(item: list) -> None:
    raw = wire.encode(Rpc())
    raw[1] = [item]
    with pytest.raises(ProtocolError):
        wire.decode(raw, 1000)


def _router() -> Router:
    return Router(b"me", GossipParams(d=2, d_lo=1, d_hi=4, d_score=1))


def test_a_plain_peer_gets_libp2p_messages_and_never_our_bundles() -> None:
    r = _router()
    r.add_peer(b"go", 0.0, plain=True)
    r.add_peer(b"lattica", 0.0)
    for p in (b"go", b"lattica"):
        r.on_rpc(p, Rpc(subscribe=[("t", True)]), 0.0)
    r.join("t", 0.0)
    r.take_outgoing()
    assert r.publish(_bundle_env(), 1.0) == 1
    out = r.take_outgoing()
    assert b"go" not in out and out[b"lattica"].messages
    lib = envelope(_signed(ALICE))
    assert r.publish(lib, 2.0) == 2
    out = r.take_outgoing()
    assert out[b"go"].messages == [lib] and out[b"lattica"].messages == [lib]


def test_a_bundle_from_a_lattica_peer_is_forwarded_to_lattica_peers_only() -> None:
    r = _router()
    for p, plain in ((b"go", True), (b"l1", False), (b"l2", False)):
        r.add_peer(p, 0.0, plain=plain)
        r.on_rpc(p, Rpc(subscribe=[("t", True)]), 0.0)
    r.join("t", 0.0)
    r.mesh["t"] = {b"go", b"l1", b"l2"}
    r.take_outgoing()
    env = _bundle_env()
    r.on_rpc(b"l1", Rpc(messages=[env]), 1.0)
    ((got, _),) = r.take_to_validate()
    r.validated(got.id, ACCEPT, 1.0)
    out = r.take_outgoing()
    assert set(out) == {b"l2"}


def test_libp2p_messages_raise_no_floor() -> None:
    """js-libp2p's seqnos are random: an author's accepted message leaving the seen cache must
    not make its later ones with lower seqnos look like replays."""
    r = Router(b"me", GossipParams(seen_max=1))
    r.add_peer(b"js", 0.0, plain=True)
    r.on_rpc(b"js", Rpc(subscribe=[("t", True)]), 0.0)
    r.join("t", 0.0)
    for i, seqno in enumerate((900, 5)):
        env = envelope(_signed(ALICE, seqno=seqno))
        r.on_rpc(b"js", Rpc(messages=[env]), 1.0 + i)
        ((got, _),) = r.take_to_validate()
        r.validated(got.id, ACCEPT, 1.0 + i)
    assert [e.seqno for e in r.take_delivered()] == [900, 5]
    assert not r._floors


def test_plain_peers_are_never_choked() -> None:
    r = Router(b"me", GossipParams(d=4, d_lo=1, d_hi=8, d_score=1, d_eager=1, choke_after=1))
    peers = [b"a", b"b", b"c"]
    for p in peers:
        r.add_peer(p, 0.0, plain=True)
        r.on_rpc(p, Rpc(subscribe=[("t", True)]), 0.0)
    r.join("t", 0.0)
    for i in range(5):
        env = envelope(_signed(ALICE, seqno=100 + i))
        for p in peers:
            r.on_rpc(p, Rpc(messages=[env]), 1.0 + i)
        for got, _ in r.take_to_validate():
            r.validated(got.id, ACCEPT, 1.0 + i)
    r.heartbeat(10.0)
    assert not any(rpc.choke for rpc in r.take_outgoing().values())
