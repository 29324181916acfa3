"""Hostile peers against pub-sub, with real nodes on loopback: topic discovery aimed at a third
party, and authors minted by the dozen.

(The service's other defences have their tests in tests/integration/test_pubsub.py: strangers
refused, forged / stale / replayed / oversized messages, malformed batches, the author rate.)"""

from __future__ import annotations

import socket
import threading
import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.actors.dht.actor import dht_ref
from lattica.actors.pubsub import pubsub_ref
from lattica.actors.pubsub.bundle import Bundle
from lattica.actors.pubsub.discovery import topic_key
from lattica.config import PubSubConfig
from lattica.errors import Timeout
from lattica.trust import MeshKey

TCP = "/ip4/127.0.0.1/tcp/0"


class _Victim:
    """A TCP listener that counts the connections made to it (a host that speaks no Lattica)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()


def test_topic_providers_that_name_a_third_party_are_dialed_once_each():
    """Strangers put provider records for a topic's key in the DHT under identities whose
    addresses are a victim's: a subscriber looking for the topic's peers dials each once, then
    leaves it alone (before: again at every lookup, 39 connections in 35 s from one node). A
    victim off loopback also has a per-IP dial budget (2, then one per 30 s)."""
    victim = _Victim()
    fakes = 6
    try:
        with lattica.Node([TCP], mesh=MeshKey.generate()) as host:
            for _ in range(fakes):
                with lattica.Node([TCP], mesh=MeshKey.generate(), pubsub=False, content=False, membership=False) as s:
                    fake = [Multiaddr(f"/ip4/127.0.0.1/tcp/{victim.port}")]
                    s._host.advertised_addrs = lambda fake=fake: fake  # its identify names the victim's address
                    s.connect(host.addrs[0])
                    time.sleep(0.2)
                    call_as(s, dht_ref(host.peer_id), "add_provider", topic_key("jobs"), 3600.0)
            sub = lattica.pubsub.subscribe("jobs", node=host)
            time.sleep(3)
            first = victim.accepted  # (one dial of each: the dialer itself may try an address more than once)
            assert 1 <= first <= 3 * fakes, first
            time.sleep(9)  # lookups at 2, 4 and 8 s more: the topic still has no peer
            assert victim.accepted == first, (
                f"dialed again: {victim.accepted} connections, {first} after the first lookup"
            )
            sub.close()
    finally:
        victim.stop = True


def _message(kp, topic, data, certs=(), sign_certs=None):
    """A bundle of one message by ``kp``'s identity, as the wire carries it."""
    body = b"".join(bytes(c) for c in lattica.codec.encode(data))
    author = kp.peer_id.to_bytes()
    seqno = time.time_ns()
    signed = Bundle([body], list(certs if sign_certs is None else sign_certs))
    sig = kp.sign(signed.signed_bytes(topic, author, seqno))
    return [topic, author, seqno, [body], sig, list(certs)] if certs else [topic, author, seqno, [body], sig]


def test_messages_by_authors_outside_the_mesh_go_nowhere_and_certificates_cannot_be_stripped():
    """A member relays bundles its throwaway keys signed (no certificate, or one of another
    mesh): they are ignored (the relay is not blamed: it may know better), so minting keys buys
    neither publishing rights nor author-rate budgets. A member's certificates are signed with
    its bundle: a copy stripped of them fails the signature."""
    key = MeshKey.generate()
    cfg = PubSubConfig(discover=False)
    a = lattica.Node([TCP], mesh=key, membership=False, pubsub=cfg).start()
    b = lattica.Node([TCP], mesh=key, membership=False, pubsub=cfg).start()
    try:
        b.connect(a.addrs[0])
        sub = lattica.pubsub.subscribe("m", node=b)
        lattica.pubsub.subscribe("m", node=a)
        assert wait_for(lambda: lattica.pubsub.peers("m", node=b) == [a.peer_id], timeout=10)
        other = MeshKey.generate()
        minted = [KeyPair.generate() for _ in range(20)]
        batch = [_message(kp, "m", f"minted {i}") for i, kp in enumerate(minted[:10])]
        batch += [_message(kp, "m", "other mesh", certs=[other.issue(kp.peer_id).to_bytes()]) for kp in minted[10:]]
        certs = a._host.trust.presented
        batch.append(_message(a.keypair, "m", "stripped", certs=(), sign_certs=certs))  # signed with them, sent without
        call_as(a, pubsub_ref(b.peer_id), "rpc", [[], batch, [], [], [], [], []])
        call_as(
            a,
            pubsub_ref(b.peer_id),
            "rpc",
            [[], [_message(a.keypair, "m", "genuine", certs=certs)], [], [], [], [], []],
        )
        assert sub.get(timeout=5).data == "genuine"
        with pytest.raises(Timeout):
            sub.get(timeout=0.5)
        svc = b._host.services.pubsub
        assert svc.rejected == 1, "only the stripped copy is refused (its signature)"
    finally:
        a.stop()
        b.stop()
